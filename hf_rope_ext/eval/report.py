"""Reports: Markdown tables and the JSON report (records and the run's metadata). The figures are in ``plots``,
whose functions are named here too."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .plots import (  # noqa: F401  (the figures, read from here too)
    log_ticks,
    passkey_grids,
    plot_far_context,
    plot_heatmap,
    plot_passkey_grid,
    plot_perplexity,
)

COLUMNS = (
    "rope_type",
    "factor",
    "length",
    "perplexity",
    "last_chunk_loss",
    "passkey_accuracy",
    "passkey_generation_accuracy",
    "far_context_loss",
    "far_context_ratio",
)


def _cell(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    return str(value)


def markdown_table(records: list[dict], columns=None) -> str:
    """One row per record; ``columns`` defaults to the COLUMNS present in any record."""
    columns = list(columns or [c for c in COLUMNS if any(c in r for r in records)])
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def pivot_table(records: list[dict], value: str = "perplexity", digits: int = 4) -> str:
    """Markdown: one row per rope_type (in order of appearance), one column per length, ``value`` in the cells."""
    names = list(dict.fromkeys(r["rope_type"] for r in records if value in r))
    lengths = sorted({r["length"] for r in records if value in r})
    cells = {(r["rope_type"], r["length"]): r[value] for r in records if value in r}
    lines = ["| rope_type | " + " | ".join(str(n) for n in lengths) + " |", "|" + " --- |" * (len(lengths) + 1)]
    for name in names:
        row = [_cell(cells.get((name, n)), digits) for n in lengths]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_json(records: list[dict], path, metadata: dict | None = None) -> Path:
    """The records as a JSON list, or with ``metadata`` (``eval.metadata.run_metadata``: what the commands write)
    ``{"metadata": ..., "records": [...]}``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = records if metadata is None else {"metadata": metadata, "records": records}
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path
