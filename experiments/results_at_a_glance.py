"""The dev-split figures of SmolLM2-135M-Instruct read at 4x its training length (32768 tokens): a table and chart of
the main configurations, and the full tables of docs/results/real-model.md (every float32 cell at 2x and 4x), made
from the committed records alone (``docs/results/real-model/results.json``).

Every pass-key figure is a count with its Wilson 95% interval. The probes are the dev split (one seed of keys, depths
and filler, the one the configurations were chosen on): labelled so.

    python experiments/results_at_a_glance.py                  # prints the tables, writes the chart
    python experiments/results_at_a_glance.py --records R.json --chart out.png
    python experiments/results_at_a_glance.py --write         # and put the tables into the pages that show them
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from hf_rope_ext.eval.intervals import wilson

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs/results/real-model/results.json"
CHART = ROOT / "docs/results/real-model/at-4x.png"
LENGTH = 32768
L0 = 8192
# results.json's key of a cell: method[+temperature]:factor[:1key][parameters] dtype; lora@ADAPTER for an adapter
CELL = re.compile(r"^(?P<name>[^:\[]+):(?P<factor>\d+)(?P<one>:1key)?(?P<params>\[[^\]]*\])? (?P<dtype>\S+)$")
HIDDEN = {"rope_theta", "rope_type", "original_max_position_embeddings", "attention_temperature"}
SAME = {"smollm2-retrieval-string2": "smollm2-string2-retrieval-lora"}  # one adapter filed under two names
STRING = "[window=8192,local_window=128,frequencies=ntk_by_parts,frequency_factor=3.02]"
# (label, cell of the classic probe, cell of the three-key probe): results.json's keys
ROWS = [
    ("`self_extend` (window 2048, groups of 9)", "self_extend:4:1key float32", "self_extend:4 float32"),
    ("`leaky_rerope` (window 2048, slope 1/5)", "leaky_rerope:4:1key float32", "leaky_rerope:4 float32"),
    ("`rerope` (window 2048)", "rerope:4:1key float32", "rerope:4 float32"),
    ("`dual_chunk` (chunk 6144, local 512)", "dual_chunk:4:1key float32", "dual_chunk:4 float32"),
    ("`string` (shift 8192, `ntk_by_parts` x3.02)", f"string:4:1key{STRING} float32", f"string:4{STRING} float32"),
    (
        "`self_extend` + retrieval LoRA",
        "lora@smollm2-self-extend-retrieval-lora:4:1key float32",
        "lora@smollm2-self-extend-retrieval-lora:4 float32",
    ),
    (
        "`yarn` x4 + retrieval LoRA",
        "lora@smollm2-yarn4-retrieval-lora:4:1key float32",
        "lora@smollm2-yarn4-retrieval-lora:4 float32",
    ),
]


def count(records: dict, cell: str) -> tuple[int, int]:
    """(hits, probes) of the cell's record at LENGTH."""
    (record,) = [r for r in records[cell] if r["length"] == LENGTH]
    n = record["multikey_probes"]
    return round(record["multikey_accuracy"] * n), n


def far_ratio(records: dict, cell: str) -> float:
    (record,) = [r for r in records[cell] if r["length"] == LENGTH]
    return record["far_context_ratio"]


def cell_text(hits: int, n: int) -> str:
    low, high = wilson(hits, n)
    return f"{hits}/{n} [{low:.2f}, {high:.2f}]"


def table(records: dict) -> str:
    """The main configurations: one row each, counts with Wilson 95% intervals."""
    lines = [
        "| at 32k tokens (4x), dev split | classic pass key | three keys a prompt | far-context ratio |",
        "|---|---:|---:|---:|",
    ]
    for label, classic, three in ROWS:
        cells = [cell_text(*count(records, classic)), cell_text(*count(records, three))]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {far_ratio(records, three):.3f} |")
    return "\n".join(lines)


def full_cells(records: dict, factor: int) -> dict[str, dict]:
    """Cells at ``factor`` in float32: row key -> {"classic": record at factor x L0, length: three-key record}."""
    rows: dict[str, dict] = {}
    for key, found in records.items():
        match = CELL.match(key)
        if not match or int(match["factor"]) != factor or match["dtype"] != "float32":
            continue
        name = match["name"]
        for old, new in SAME.items():
            name = name.replace(old, new)
        row = rows.setdefault(name + (match["params"] or ""), {})
        for record in found:
            row["classic" if match["one"] else record["length"]] = record
    return rows


def row_label(row: dict) -> str:
    """The method as the records name it, with the parameters it ran with (the adapter's config for an adapter)."""
    record = next(iter(row.values()))
    name = record["rope_type"].removesuffix(" (float32)")
    name = re.sub(r" \w+=.*$", "", name) if record.get("rope_parameters") else name
    params = record.get("rope_parameters") or {}
    shown = " ".join(f"{k}={value_text(v)}" for k, v in params.items() if k not in HIDDEN)
    for old, new in SAME.items():
        name = name.replace(old, new)
    return f"{name} ({shown})" if shown else name


def value_text(value) -> str:
    return "null" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def full_table(records: dict, factor: int) -> str:
    """Every float32 cell at ``factor``: classic probe, three-key probe at L0 and factor x L0, far ratio, perplexity."""
    long = factor * L0
    lines = [
        f"| {long // 1024}k tokens ({factor}x), dev split | classic pass key | three keys {L0 // 1024}k "
        f"| three keys {long // 1024}k | far-context ratio | perplexity |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(full_cells(records, factor).values(), key=row_label):
        pick = [row.get("classic"), row.get(L0), row.get(long)]
        counts = ["-" if r is None else cell_text(round(r["multikey_accuracy"] * r["multikey_probes"]),
                                                  r["multikey_probes"]) for r in pick]  # fmt: skip
        far = "-" if pick[2] is None else f"{pick[2]['far_context_ratio']:.3f} | {pick[2]['perplexity']:.2f}"
        lines.append(f"| {row_label(row)} | {' | '.join(counts)} | {far if pick[2] else '- | -'} |")
    return "\n".join(lines)


def chart(records: dict, path: Path) -> None:
    """Hit rate with its interval, classic and three-key probes, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    rows = range(len(ROWS))
    for offset, column, name in ((-0.15, 1, "classic pass key (one key)"), (0.15, 2, "three keys a prompt")):
        rates, errors = [], [[], []]
        for row in ROWS:
            hits, n = count(records, row[column])
            low, high = wilson(hits, n)
            rates.append(hits / n)
            errors[0].append(max(0.0, hits / n - low))
            errors[1].append(max(0.0, high - hits / n))
        ax.errorbar(rates, [i + offset for i in rows], xerr=errors, fmt="o", capsize=3, label=name)
    ax.set_yticks(list(rows), [row[0].replace("`", "") for row in ROWS])
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("hits / probes, Wilson 95% interval")
    ax.set_title("SmolLM2-135M-Instruct at 32k tokens (4x), dev split")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=RECORDS, help="results.json of the real-model cells")
    parser.add_argument("--chart", type=Path, default=CHART, help="where the PNG goes")
    parser.add_argument("--write", action="store_true", help="replace the tables in the pages (PAGES) by these")
    args = parser.parse_args(argv)
    records = json.loads(args.records.read_text(encoding="utf-8"))
    tables = {
        "real-model-glance": table(records),
        "real-model-4x": full_table(records, 4),
        "real-model-2x": full_table(records, 2),
    }
    print(*tables.values(), sep="\n\n")
    chart(records, args.chart)
    for name, page in PAGES.items() if args.write else ():
        replace_block(page, name, tables[name])
    return 0


PAGE = ROOT / "docs/results/real-model.md"
PAGES = {"real-model-glance": PAGE, "real-model-4x": PAGE, "real-model-2x": PAGE}


def replace_block(page: Path, name: str, text: str) -> None:
    """The text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` of ``page`` replaced by ``text``."""
    found = re.compile(rf"(<!-- {name}:start -->\n).*?(\n<!-- {name}:end -->)", re.S)
    old = page.read_text(encoding="utf-8")
    if not found.search(old):
        raise SystemExit(f"{page}: no <!-- {name}:start --> ... <!-- {name}:end --> block to replace")
    page.write_text(found.sub(lambda m: m.group(1) + text + m.group(2), old), encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
