"""The probes' table (``hits/n [lo, hi]`` per probe and length) and plot (accuracy against length with the Wilson 95%
interval drawn as an error bar), for the records of ``eval.probes``."""

from __future__ import annotations

from .intervals import shown
from .plots import _pyplot, style


def probe_table(records: list[dict]) -> str:
    """Markdown: one row per (rope type, split, probe), one column per length."""
    rows = list(dict.fromkeys((r["rope_type"], r["split"], r["probe"]) for r in records))
    lengths = sorted({r["length"] for r in records})
    cells = {(r["rope_type"], r["split"], r["probe"], r["length"]): shown(r) for r in records}
    lines = [
        "| rope_type | split | probe | " + " | ".join(map(str, lengths)) + " |",
        "|---|---|---|" + "---:|" * len(lengths),
    ]
    for row in rows:
        lines.append("| " + " | ".join(row) + " | " + " | ".join(cells.get((*row, n), "-") for n in lengths) + " |")
    return "\n".join(lines)


def plot_probes(records: list[dict], path, title: str) -> None:
    """Accuracy against length, one line per (rope type, split, probe), each point with its interval as error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, row in enumerate(dict.fromkeys((r["rope_type"], r["split"], r["probe"]) for r in records)):
        mine = sorted(
            (r for r in records if (r["rope_type"], r["split"], r["probe"]) == row), key=lambda r: r["length"]
        )
        x, y = [r["length"] for r in mine], [r["accuracy"] for r in mine]
        below = [r["accuracy"] - r["interval"][0] for r in mine]  # error bars: distances to the bounds
        above = [r["interval"][1] - r["accuracy"] for r in mine]
        ax.errorbar(x, y, yerr=[below, above], capsize=4, label=" ".join(row), **style(i))
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tokens")
    ax.set_ylabel("pass keys found (Wilson 95% interval)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
