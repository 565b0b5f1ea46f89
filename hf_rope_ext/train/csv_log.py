"""The training log: one CSV row per optimizer step (main process only)."""

from __future__ import annotations

import csv
from pathlib import Path

LOG_FILE = "train_log.csv"
LOG_COLUMNS = ("step", "stage", "span", "window", "loss", "lr", "tokens", "elapsed_s")  # tokens: of this step


class CsvLog:
    """Appends one row per optimizer step to ``log_dir/train_log.csv`` (main process only). Opened at a resumed
    step, it keeps the rows up to that step and drops those past it (written after the checkpoint by the run that
    stopped), and a last line cut short, so each step has one row and the log equals the uninterrupted run's."""

    def __init__(self, log_dir: Path, enabled: bool, start_step: int = 0):
        self.path = Path(log_dir) / LOG_FILE
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = self._rows_up_to(start_step) if self.path.exists() else []
            self.path.write_text("".join([",".join(LOG_COLUMNS) + "\n", *kept]), encoding="utf-8")

    def _rows_up_to(self, step: int) -> list[str]:
        """The log's whole data lines (with their newline and every column) of steps <= ``step``."""
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)[1:]
        whole = [line for line in lines if line.endswith("\n") and line.count(",") == len(LOG_COLUMNS) - 1]
        return [line for line in whole if int(line.split(",", 1)[0]) <= step]

    def write(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a", newline="", encoding="utf-8") as handle:
                csv.DictWriter(handle, LOG_COLUMNS).writerow(row)
