"""RULER results as a report: one Markdown table per task (a row per method, a column per length, each cell the
samples answered out of those read with the Wilson 95% interval, or, for a task whose samples ask several values,
the mean score lm-eval computed with the number of samples) and a figure of score against length, one panel per task
and one line per method."""

from __future__ import annotations

from .intervals import shown
from .plots import _pyplot, _write, style

SAVED = "none"
COUNTED, MEAN = "samples answered / read, Wilson 95% interval", "lm-eval's score, 0-1, with the samples read"


def cell(record: dict) -> str:
    """``hits/n [lo, hi]`` of a counted record, else ``score (samples)``."""
    return shown(record) if "hits" in record else f"{record['ruler_score']:.2f} ({record['samples']})"


def tables(records: list[dict]) -> str:
    """Markdown: for every task, methods x lengths, each record's ``cell``; a method read at one length with two factors
    (extend: L0 with the smallest) shows the first."""
    parts = []
    for task in dict.fromkeys(r["task"] for r in records):
        rows = [r for r in records if r["task"] == task]
        names = list(dict.fromkeys(r["rope_type"] for r in rows))
        lengths = sorted({r["length"] for r in rows})
        cells: dict = {}
        for r in rows:
            cells.setdefault((r["rope_type"], r["length"]), cell(r))
        what = COUNTED if all("hits" in r for r in rows) else MEAN
        parts += [f"RULER `{task}` ({what}):", ""]
        parts += ["| rope_type | " + " | ".join(str(n) for n in lengths) + " |", "|" + " --- |" * (len(lengths) + 1)]
        parts += [f"| {n} | " + " | ".join(cells.get((n, x), "-") for x in lengths) + " |" for n in names]
        parts.append("")
    return "\n".join(parts)


def plot(records: list[dict], path, title: str = "RULER (lm-eval) score against length") -> object:
    """Score against length (log2 axis), one panel per task, one line per method, the model as saved in grey."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in records))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks) + 1.0, 4.2), sharey=True, squeeze=False)
    lengths = sorted({r["length"] for r in records})
    for ax, task in zip(axes[0], tasks, strict=True):
        rows = [r for r in records if r["task"] == task]
        names = list(dict.fromkeys(r["rope_type"] for r in rows))
        for i, name in enumerate(names):
            points = sorted({r["length"]: r["ruler_score"] for r in reversed(rows) if r["rope_type"] == name}.items())
            xs, ys = [x for x, _ in points], [y for _, y in points]
            if name == SAVED:
                ax.plot(xs, ys, color="0.55", linestyle=":", marker=".", label=f"{SAVED} (as saved)")
            else:
                ax.plot(xs, ys, label=name, **style(i))
        ax.set_title(task, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(lengths, labels=[str(x) for x in lengths], fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=7)
    fig.supxlabel("length (tokens)")
    fig.supylabel("score (share of expected values found)")
    fig.suptitle(title)
    return _write(fig, plt, path)
