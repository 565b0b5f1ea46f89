"""Figures of the evaluation: metric-against-length curves with the methods grouped by level (perplexity on a log
scale; the far-context ratio against the sliding-window baseline at 1), passkey heatmaps per method, and the
needle-in-a-haystack heatmap.

In the curves each level gets its own panel (the model as saved and transformers' types; the package's
frequency-level types; its attention-level types), so that a panel holds a few lines in distinct colours, and the
model as saved is drawn in grey in every panel for reference.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..types.registry import BUILTIN_TYPES, get_method

MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")
LINESTYLES = ("-", "--", "-.", ":")
NICE_TICKS = [m * 10**e for e in range(-1, 6) for m in (1, 1.5, 2, 3, 4, 5, 6, 8)]  # log-axis labels
LEVELS = {
    "builtin": "as saved and transformers' types",
    "frequency": "frequency-level (hf-rope-ext)",
    "attention": "attention-level (hf-rope-ext)",
}
SAVED = "none"  # the model as saved: the reference line of every panel


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


def level_of(name: str) -> str:
    """``builtin``, ``frequency`` or ``attention`` for a record's rope_type (a label such as "yarn (after)" too)."""
    base = name.split(" (")[0]
    if base in (SAVED, "default") or base in BUILTIN_TYPES:
        return "builtin"
    try:
        return get_method(base).kind
    except KeyError:
        return "builtin"


def by_level(records: list[dict], value: str) -> list[tuple[str, list[str]]]:
    """(panel title, rope_types in order of appearance) per level that has a record with ``value``."""
    names = list(dict.fromkeys(r["rope_type"] for r in records if value in r))
    groups = {level: [n for n in names if level_of(n) == level] for level in LEVELS}
    return [(LEVELS[level], members) for level, members in groups.items() if members]


def series(records: list[dict], name: str, value: str) -> tuple[list, list]:
    rows = sorted((r["length"], r[value]) for r in records if r["rope_type"] == name and value in r)
    return [x for x, _ in rows], [y for _, y in rows]


def plot_by_level(
    records: list[dict], path, value: str, ylabel: str, title: str, baseline=None, pretraining_length=None
) -> Path:
    """``value`` against length (both log scale), one panel per level (:func:`by_level`), with a dashed horizontal
    line at ``baseline`` and a vertical one at ``pretraining_length`` in every panel when given."""
    plt = _pyplot()
    groups = by_level(records, value)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.4 * len(groups) + 1.2, 4.4), sharey=True, squeeze=False)
    for ax, (panel, names) in zip(axes[0], groups, strict=True):
        draw_panel(ax, records, names, value, panel)
        if baseline is not None:
            ax.axhline(baseline, color="black", linestyle="--", linewidth=1, label="sliding-window baseline")
        if pretraining_length:
            ax.axvline(pretraining_length, color="grey", linestyle="--", linewidth=1, label="pretraining length")
    finish_axes(axes[0], records, value)
    fig.supxlabel("evaluation length (tokens)")
    fig.supylabel(ylabel)
    fig.suptitle(title)
    return _write(fig, plt, path)


def draw_panel(ax, records: list[dict], names: list[str], value: str, panel: str) -> None:
    """The panel's methods in the cycle of :func:`style`, the model as saved in grey under them."""
    if any(r["rope_type"] == SAVED and value in r for r in records):
        ax.plot(*series(records, SAVED, value), color="0.55", linestyle=":", marker=".", label=f"{SAVED} (as saved)")
    for i, name in enumerate(n for n in names if n != SAVED):
        ax.plot(*series(records, name, value), label=name, **style(i))
    ax.set_title(panel, fontsize=10)


def finish_axes(axes, records: list[dict], value: str) -> None:
    """Log axes (lengths base 2, labelled at the measured lengths; values labelled by :func:`log_ticks`), legends."""
    lengths = sorted({r["length"] for r in records if value in r})
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.minorticks_off()
        ax.set_xticks(lengths, labels=[str(x) for x in lengths], fontsize=8)
        ax.legend(fontsize=7)
    ticks = log_ticks(*axes[0].get_ylim())
    axes[0].set_yticks(ticks, labels=[f"{t:g}" for t in ticks])


def plot_perplexity(records: list[dict], path, pretraining_length: int | None = None, title=None) -> Path:
    """Perplexity against length (both log scale), one panel per level of method."""
    title = title or "perplexity of truncated documents against length"
    return plot_by_level(records, path, "perplexity", "perplexity (log scale)", title, None, pretraining_length)


def plot_far_context(records: list[dict], path, title=None) -> Path:
    """The far-context ratio against length, one panel per level, the sliding-window baseline at 1: below the line a
    method reads the context beyond the pretraining length to its profit."""
    title = title or "far-context perplexity ratio against length (below 1: the longer context helps)"
    return plot_by_level(records, path, "far_context_ratio", "far-context ratio (log scale)", title, baseline=1.0)


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
    return _write(fig, plt, path)


def _write(fig, plt, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
