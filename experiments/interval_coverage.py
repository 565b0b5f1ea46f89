"""The coverage of the multikey probes' 95% intervals, simulated (``hf_rope_ext.eval.coverage``): the table of
docs/results/real-model/coverage.md.

    python experiments/interval_coverage.py           # print the page
    python experiments/interval_coverage.py --write   # and write it

Grid: hit rate 0.1 to 0.9, intra-prompt correlation 0, 0.3, 0.6 and 0.8, 8 and 24 prompts of 3 keys. The interval
the pages show (Wilson by prompt) over 10,000 draws a cell; beside it the lowest coverage of each row for Wilson by key
(10,000 draws) and the percentile cluster bootstrap (2,000 draws of 2,000 resamples).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_rope_ext.eval.coverage import coverage

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results" / "real-model" / "coverage.md"
RATES = [r / 10 for r in range(1, 10)]
RHOS = [0, 0.3, 0.6, 0.8]
PROMPTS = [8, 24]
KEYS = 3
DRAWS = {"by prompt": 10_000, "by key": 10_000, "bootstrap": 2_000}
FLOOR = 0.93  # what a nominal 95% interval must cover in every cell

INTRO = """# How often the multikey intervals cover

A multikey prompt asks three keys, and keys of one prompt are found or missed together more often than apart. The
probe pages give a multikey count the Wilson 95% interval of its share of keys with n = the number of prompts
(`hf_rope_ext.eval.paired.by_prompt`). This page simulates how often that interval holds the true share: each
prompt's hit rate drawn from a beta distribution with the cell's mean and intra-prompt correlation (rho), its three
keys found independently at that rate (`hf_rope_ext.eval.coverage`). {draws} draws a cell; made by `python
experiments/interval_coverage.py --write`. The requirement: at least {floor:.0%} in every cell.

The last two columns are each row's lowest coverage for the intervals not used: Wilson counting every key as a draw,
and the percentile bootstrap over prompts (which the pages used before; {boot} draws of 2,000 resamples a cell).
"""


def rows() -> list[dict]:
    """One row per (prompts, rho): the coverage by prompt at every rate, the lowest by key and by bootstrap."""
    out = []
    for prompts in PROMPTS:
        for rho in RHOS:
            cells = [coverage("by prompt", r, rho, prompts, KEYS, DRAWS["by prompt"]) for r in RATES]
            low = {m: min(coverage(m, r, rho, prompts, KEYS, DRAWS[m]) for r in RATES) for m in ("by key", "bootstrap")}
            out.append({"prompts": prompts, "rho": rho, "by prompt": cells} | low)
    return out


def page(found: list[dict]) -> str:
    head = "| prompts | rho | " + " | ".join(f"{r:.1f}" for r in RATES) + " | lowest, by key | lowest, bootstrap |"
    lines = [head, "|---:|---:|" + "---:|" * (len(RATES) + 2)]
    for row in found:
        cells = " | ".join(f"{c:.3f}" for c in row["by prompt"])
        lines.append(f"| {row['prompts']} | {row['rho']} | {cells} | {row['by key']:.3f} | {row['bootstrap']:.3f} |")
    worst = min(min(row["by prompt"]) for row in found)
    verdict = (
        f"Lowest coverage of Wilson by prompt over the grid: {worst:.3f} ({'met' if worst >= FLOOR else 'missed'})."
    )
    intro = INTRO.format(draws=f"{DRAWS['by prompt']:,}", floor=FLOOR, boot=f"{DRAWS['bootstrap']:,}")
    return (
        intro
        + "\nCoverage of Wilson by prompt, by hit rate (columns):\n\n"
        + "\n".join(lines)
        + "\n\n"
        + verdict
        + "\n"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {PAGE.name}")
    text = page(rows())
    print(text)
    if parser.parse_args(argv).write:
        PAGE.write_text(text)


if __name__ == "__main__":
    main()
