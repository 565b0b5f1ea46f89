"""Reports: a Markdown table and a JSON list of records, a perplexity-against-length plot, a needle heatmap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

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
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")
LINESTYLES = ("-", "--", "-.", ":")


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


def log_ticks(low: float, high: float) -> list[float]:
    """Labelled ticks for a log axis over [low, high]: the NICE_TICKS inside, or when fewer than three fall inside
    (a narrow range), five evenly spaced values rounded to the fewest significant digits (3 or more) that keep
    them apart."""
    ticks = [t for t in NICE_TICKS if low <= t <= high]
    if len(ticks) >= 3:
        return ticks
    even = [low + (high - low) * k / 4 for k in range(5)]
    digits = next((d for d in range(3, 16) if len({f"{v:.{d}g}" for v in even}) == 5), 16)
    return [float(f"{v:.{digits}g}") for v in even]


def style(i: int) -> dict:
    """Line style of the i-th series: colour, marker and dash pattern all cycle, and markers shrink with i (hollow),
    so a series drawn over an identical one leaves the earlier one's larger marker visible around it."""
    import matplotlib.pyplot as plt

    return {
        "color": plt.get_cmap("tab10")(i % 10),
        "marker": MARKERS[i % len(MARKERS)],
        "linestyle": LINESTYLES[i % len(LINESTYLES)],
        "markersize": max(4.0, 11.0 - 0.6 * i),
        "markerfacecolor": "none",
        "markeredgewidth": 1.5,
        "linewidth": 1.4,
    }


def plot_perplexity(records: list[dict], path, pretraining_length: int | None = None, title=None) -> Path:
    """Perplexity against length (both log scale), one line per rope_type."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(dict.fromkeys(r["rope_type"] for r in records if "perplexity" in r))
    for i, name in enumerate(names):
        rows = sorted((r["length"], r["perplexity"]) for r in records if r["rope_type"] == name and "perplexity" in r)
        ax.plot([x for x, _ in rows], [y for _, y in rows], label=name, **style(i))
    if pretraining_length:
        ax.axvline(pretraining_length, color="grey", linestyle="--", linewidth=1, label="pretraining length")
    lengths = sorted({r["length"] for r in records if "perplexity" in r})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_xticks(lengths, labels=[str(x) for x in lengths])
    ticks = log_ticks(*ax.get_ylim())
    ax.set_yticks(ticks, labels=[f"{t:g}" for t in ticks])
    title = title or "perplexity of truncated documents against length"
    ax.set(xlabel="evaluation length (tokens)", ylabel="perplexity (log scale)", title=title)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, plt, path)


def passkey_grids(records: list[dict]) -> dict:
    """{rope_type: (depths, lengths, grid)} from the records' ``passkey_by_depth``; grid[d][l] is the accuracy at
    depth d and length l (NaN where not measured)."""
    grids = {}
    for name in dict.fromkeys(r["rope_type"] for r in records if "passkey_by_depth" in r):
        rows = {
            r["length"]: dict(map(tuple, r["passkey_by_depth"]))
            for r in records
            if r["rope_type"] == name and "passkey_by_depth" in r
        }
        lengths = sorted(rows)
        depths = sorted({d for row in rows.values() for d in row})
        grids[name] = (depths, lengths, [[rows[n].get(d, math.nan) for n in lengths] for d in depths])
    return grids


def plot_passkey_grid(records: list[dict], path, title="passkey accuracy by depth and length") -> Path:
    """One heatmap per rope_type (depth down, length across, accuracy in the cells), in a grid of panels."""
    plt = _pyplot()
    grids = passkey_grids(records)
    cols = min(4, len(grids))
    rows = math.ceil(len(grids) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.4 * cols + 1, 2.6 * rows + 0.8), squeeze=False, layout="constrained"
    )
    for ax, (name, (depths, lengths, grid)) in zip(axes.flat, grids.items(), strict=False):
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for (d, n), v in np.ndenumerate(np.asarray(grid, dtype=float)):
            ax.text(n, d, "-" if math.isnan(v) else f"{v:.0%}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), labels=[str(x) for x in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), labels=[f"{d:.0%}" for d in depths], fontsize=7)
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(grids) :]:
        ax.axis("off")
    fig.supxlabel("context length (tokens)")
    fig.supylabel("pass key depth")
    fig.suptitle(title)
    fig.colorbar(image, ax=axes, label="accuracy", shrink=0.8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
