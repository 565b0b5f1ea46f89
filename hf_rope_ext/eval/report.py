"""Reports: a Markdown table and a JSON list of records, a perplexity-against-length plot, a needle heatmap."""

from __future__ import annotations

import json
import math
from pathlib import Path

COLUMNS = (
    "rope_type",
    "factor",
    "length",
    "perplexity",
    "last_chunk_loss",
    "passkey_accuracy",
    "passkey_generation_accuracy",
)


NICE_TICKS = [m * 10**e for e in range(-1, 6) for m in (1, 1.5, 2, 3, 4, 5, 6, 8)]  # log-axis labels


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


def write_json(records: list[dict], path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_perplexity(records: list[dict], path, pretraining_length: int | None = None, title=None) -> Path:
    """Perplexity against length (both log scale), one line per rope_type."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(dict.fromkeys(r["rope_type"] for r in records if "perplexity" in r))
    colors = plt.get_cmap("tab20")(range(len(names)))
    for i, name in enumerate(names):
        rows = sorted((r["length"], r["perplexity"]) for r in records if r["rope_type"] == name and "perplexity" in r)
        style = ("-", "--", ":")[i // 10 % 3]
        ax.plot([x for x, _ in rows], [y for _, y in rows], marker="o", linestyle=style, color=colors[i], label=name)
    if pretraining_length:
        ax.axvline(pretraining_length, color="grey", linestyle="--", linewidth=1, label="pretraining length")
    lengths = sorted({r["length"] for r in records if "perplexity" in r})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_xticks(lengths, labels=[str(x) for x in lengths])
    low, high = ax.get_ylim()
    ticks = [t for t in NICE_TICKS if low <= t <= high]
    ax.set_yticks(ticks, labels=[f"{t:g}" for t in ticks])
    ax.set(xlabel="evaluation length (tokens)", ylabel="perplexity (log scale)", title=title or "")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, plt, path)


def plot_heatmap(grid, depths, lengths, path, title="needle in a haystack") -> Path:
    """``grid`` (depths x lengths) of accuracies in [0, 1] as a heatmap, depth down, length across."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.5 * len(depths)))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), labels=[str(x) for x in lengths])
    ax.set_yticks(range(len(depths)), labels=[f"{d:.0%}" for d in depths])
    ax.set(xlabel="context length (tokens)", ylabel="needle depth", title=title)
    fig.colorbar(image, ax=ax, label="accuracy")
    return _save(fig, plt, path)


def _save(fig, plt, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
