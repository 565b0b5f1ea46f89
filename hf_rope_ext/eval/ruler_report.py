"""RULER results as a report: one Markdown table per task (a row per method, a column per length, each cell the
score lm-eval computed with the number of samples it read) and a figure of score against length, one panel per task
and one line per method."""

from __future__ import annotations

from .plots import _pyplot, _write, style

SAVED = "none"


def cell(record: dict) -> str:
    return f"{record['ruler_score']:.2f} ({record['samples']})"


def tables(records: list[dict]) -> str:
    """Markdown: for every task, methods x lengths, ``score (samples)``; a method read at one length with two factors
    (extend: L0 with the smallest) shows the first."""
    parts = []
    for task in dict.fromkeys(r["task"] for r in records):
        rows = [r for r in records if r["task"] == task]
        names = list(dict.fromkeys(r["rope_type"] for r in rows))
        lengths = sorted({r["length"] for r in rows})
        cells: dict = {}
        for r in rows:
            cells.setdefault((r["rope_type"], r["length"]), cell(r))
        parts += [f"RULER `{task}` (lm-eval's score, 0-1, with the samples read):", ""]
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
