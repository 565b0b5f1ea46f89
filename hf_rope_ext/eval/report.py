"""Reports: Markdown tables and the JSON report (records and the run's metadata). The figures are in ``plots``,
whose functions are named here too."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .intervals import shown
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


# a score column -> the fields of its count and interval: shown as "hits/n [lo, hi]" where a record has them
SCORED = {
    "passkey_accuracy": ("passkey_hits", "passkey_samples", "passkey_interval"),
    "passkey_generation_accuracy": ("passkey_generation_hits", "passkey_samples", "passkey_generation_interval"),
    "multikey_accuracy": ("multikey_hits", "multikey_probes", "multikey_interval"),
}


def scored(record: dict, column: str) -> str | None:
    """``hits/n [lo, hi]`` of a score column of ``record`` (SCORED), None where the record has no count for it."""
    fields = SCORED.get(column, ())
    if not fields or any(f not in record for f in fields):
        return None
    return shown({"hits": record[fields[0]], "n": record[fields[1]], "interval": record[fields[2]]})


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
    lines += ["| " + " | ".join(scored(r, c) or _cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def pivot_table(records: list[dict], value: str = "perplexity", digits: int = 4) -> str:
    """Markdown: one row per rope_type (in order of appearance), one column per length, ``value`` in the cells."""
    names = list(dict.fromkeys(r["rope_type"] for r in records if value in r))
    lengths = sorted({r["length"] for r in records if value in r})
    cells = {(r["rope_type"], r["length"]): scored(r, value) or _cell(r[value], digits) for r in records if value in r}
    lines = ["| rope_type | " + " | ".join(str(n) for n in lengths) + " |", "|" + " --- |" * (len(lengths) + 1)]
    for name in names:
        row = [cells.get((name, n), "-") for n in lengths]
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
