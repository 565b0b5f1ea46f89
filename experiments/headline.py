"""The headline of the real-model results: on SmolLM2-135M-Instruct (trained at 8192 tokens) at 4x (32768 tokens),
the best training-free configuration and the best adapter, chosen on the dev split and measured once on the held-out
test split.

    python experiments/headline.py            # choose on dev, score the test logs, write the table and the chart
    python experiments/headline.py --write    # and put the table into README, the results page and the adapter's card

1. The choice: among the 4x cells of ``docs/results/real-model/results.json`` (every earlier figure, all on the dev
   probe), those with both dev probes at 32768 tokens (the classic one key per prompt, and three keys per prompt),
   the one with the most hits over both, training-free and with an adapter apart.
2. The test cells are run by ``hf-rope-ext eval --probes ... --split test --log ...`` (``TEST_CELLS`` has each
   command) and read back from their logs, however far they got: every logged prompt is checked against the test
   split's prompt of the same id (its tokens' hash) before its probes count.
3. Written: ``results.json`` gains ``split``, ``multikey_hits`` and ``multikey_interval`` on every dev record that
   lacks them, and the test records under ``test:<cell>:<probe>``; ``headline.md`` (the table) and ``headline.png``
   (the chart), each score as hits/n with its Wilson 95% interval. A target counts as met only where the interval's
   lower bound clears it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_rope_ext.eval import probes, splits
from hf_rope_ext.eval.adapters import training_command
from hf_rope_ext.eval.intervals import score, shown, verdict
from hf_rope_ext.eval.metadata import folder_hash

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_at_a_glance as glance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "real-model"
LENGTH = 32768
SAMPLES = {"classic": 30, "multikey": 8}  # prompts per probe on test: 30 keys, 8 x 3 = 24 keys
TARGETS = {"training-free": 0.8, "adapter": 0.9}  # share of keys found at 4x
MODEL = "<smollm2>"  # `hf-rope-ext get-smollm2` prints the folder
ADAPTER = "examples/smollm2-self-extend-retrieval-lora"
EVAL = "hf-rope-ext eval --model {model} {flags} --probes {probe} --split test --samples {n} --lengths 32768 "
EVAL += "--dtype float32 --log docs/results/real-model/test-probes-{cell}.jsonl"
SHORT = {"se": "Self-Extend (w 2048, g 9)", "se-lora": "Self-Extend + retrieval LoRA"}  # the chart's names
TEST_CELLS = {  # cell -> (kind, dev key in results.json, the eval flags)
    "se": (
        "training-free",
        "self_extend:4",
        "--rope-type self_extend --rope-param window=2048 --rope-param group_size=9",
    ),
    "se-lora": ("adapter", "lora@smollm2-self-extend-retrieval-lora:4", f"--adapter {ADAPTER}"),
}


def dev_cells(done: dict) -> dict[str, dict]:
    """4x dev cells with both probes at 32768 tokens: name -> {"classic": record, "multikey": record}."""
    cells = {}
    for key, records in done.items():
        if key.startswith(("baseline:", "test:")) or not key.endswith("float32"):
            continue
        name, probe = key.replace(":1key", "").removesuffix(" float32"), "classic" if ":1key" in key else "multikey"
        at = [r for r in records if r["length"] == LENGTH and "multikey_probes" in r]
        if ":4" in name and at:
            cells.setdefault(name, {})[probe] = at[0]
    return {name: probes_of for name, probes_of in cells.items() if len(probes_of) == 2}


def choose(done: dict) -> dict[str, str]:
    """kind ("training-free", "adapter") -> the dev cell with the most hits over both probes (ties: the first)."""
    hits = lambda pair: sum(round(r["multikey_accuracy"] * r["multikey_probes"]) for r in pair.values())  # noqa: E731
    cells = dev_cells(done)
    kinds = {"adapter": [n for n in cells if n.startswith("lora")]}
    kinds["training-free"] = [n for n in cells if not n.startswith("lora")]
    return {kind: max(names, key=lambda n: hits(cells[n])) for kind, names in kinds.items()}


def annotate_dev(done: dict) -> None:
    """Every record with a multikey score gets its split (dev), hits and Wilson interval, and an adapter cell whose
    adapter is in ``examples/`` the adapter's rope parameters, sha256 and training command (in place)."""
    for key, records in done.items():
        for r in records if not key.startswith(("baseline:", "test:")) else []:
            if "multikey_probes" in r and "multikey_interval" not in r:
                hits = round(r["multikey_accuracy"] * r["multikey_probes"])
                interval = score(hits, r["multikey_probes"])["interval"]
                r |= {"split": "dev", "multikey_hits": hits, "multikey_interval": interval}
            folder = ROOT / "examples" / key.partition("@")[2].partition(":")[0]
            if key.startswith("lora@") and r.get("rope_parameters") is None and (folder / "config.json").is_file():
                r["rope_parameters"] = json.loads((folder / "config.json").read_text())["rope_parameters"]
                r |= {"adapter_sha256": folder_hash(folder), "adapter_training_command": training_command(folder)}


def test_records(tokenizer, cell: str, log: Path) -> list[dict]:
    """The test records of a cell's log: per probe, the logged prompts that are the test split's (same hash)."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    records = []
    for probe, n in SAMPLES.items():
        chosen = {p.prompt_id: p for p in splits.prompts(tokenizer, "test", probe, LENGTH, n)}
        found = [(chosen[x["prompt_id"]], x) for x in lines if x["prompt_id"] in chosen]
        found = [(p, x) for p, x in found if x["prompt_sha"] == probes.prompt_sha(p)]
        if found:
            record = probes.aggregate(
                "test", probe, LENGTH, [x["probes"] for _, x in found], [len(p.ids) for p, _ in found]
            )
            records.append(record | {"planned": n, "cell": found[0][1]["cell"], "command": command(cell, probe)})
    return records


def command(cell: str, probe: str) -> str:
    return EVAL.format(model=MODEL, flags=TEST_CELLS[cell][2], probe=probe, n=SAMPLES[probe], cell=cell)


def table(done: dict, chosen: dict) -> str:
    """Markdown: per chosen configuration and probe, the dev and test scores and the target's verdict on test."""
    lines = ["| configuration | probe | dev (chosen on it) | test (held out) | target | on test |"]
    lines.append("|---|---|---|---|---:|---|")
    for cell, (kind, dev_key, _) in TEST_CELLS.items():
        dev = dev_cells(done).get(dev_key, {})
        for probe in SAMPLES:
            test = done.get(f"test:{cell}:{probe}", [None])[0]
            dev_shown = shown(dev_of(dev[probe])) if probe in dev else "-"
            test_shown = "-" if test is None else shown(test) + progress(test)
            met = "-" if test is None else verdict(test, TARGETS[kind])
            lines.append(
                f"| {label(done, dev_key)} | {probe} | {dev_shown} | {test_shown} | {TARGETS[kind]:.0%} | {met} |"
            )
    chose = ", ".join(f"{kind}: `{name}`" for kind, name in chosen.items())
    return "\n".join(lines) + f"\n\nChosen on dev (most hits over both probes at 32768 tokens): {chose}.\n"


def dev_of(record: dict) -> dict:
    return {"hits": record["multikey_hits"], "n": record["multikey_probes"], "interval": record["multikey_interval"]}


def progress(record: dict) -> str:
    prompts = record["n"] // splits.KINDS[record["probe"]]
    return "" if prompts >= record["planned"] else f" ({prompts} of {record['planned']} prompts so far)"


def label(done: dict, dev_key: str) -> str:
    """The configuration's name: its rope type and the parameters it sets (and its adapter)."""
    record = done[f"{dev_key} float32"][0]
    params = record["rope_parameters"]
    fixed = ("rope_type", "rope_theta", "original_max_position_embeddings")
    name = " ".join([params["rope_type"], *(f"{k}={v}" for k, v in sorted(params.items()) if k not in fixed)])
    return name + (" + LoRA " + dev_key.split("@")[1].split(":")[0] if dev_key.startswith("lora@") else "")


def plot(done: dict, path: Path) -> None:
    """Points with Wilson 95% error bars: per configuration and probe, dev and test side by side."""
    from hf_rope_ext.eval.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    rows = [(cell, probe) for cell in TEST_CELLS for probe in SAMPLES]
    for shift, split, colour in ((-0.12, "dev", "tab:grey"), (0.12, "test", "tab:blue")):
        labelled = False
        for i, (cell, probe) in enumerate(rows):
            record = split_record(done, cell, probe, split)
            if record is not None:
                lo, hi = record["interval"]
                y = record["hits"] / record["n"]
                ax.errorbar(i + shift, y, yerr=[[y - lo], [hi - y]], fmt="o", color=colour, capsize=5,
                            label=None if labelled else split)  # fmt: skip
                labelled = True
                ax.annotate(
                    f"{record['hits']}/{record['n']}",
                    (i + shift, y),
                    xytext=(6, -3),
                    textcoords="offset points",
                    fontsize=8,
                )
    for cell, (kind, _, _) in TEST_CELLS.items():
        xs = [i for i, row in enumerate(rows) if row[0] == cell]
        ax.hlines(TARGETS[kind], xs[0] - 0.4, xs[-1] + 0.4, colors="tab:red", linestyles=":", label=f"target, {kind}")
    ax.set_xticks(range(len(rows)), [f"{SHORT[c]}\n{p}" for c, p in rows], fontsize=8)
    ax.set_ylim(-0.02, 1.05)
    ax.set_ylabel("pass keys found at 32768 tokens")
    ax.set_title("SmolLM2-135M at 4x: chosen on dev, measured on test (Wilson 95% intervals)")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def split_record(done: dict, cell: str, probe: str, split: str) -> dict | None:
    if split == "test":
        return done.get(f"test:{cell}:{probe}", [None])[0]
    dev = dev_cells(done).get(TEST_CELLS[cell][1], {})
    return dev_of(dev[probe]) if probe in dev else None


def main(argv=None) -> None:
    from hf_rope_ext.eval import loading
    from hf_rope_ext.store import smollm2

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace the table in the pages (PAGES) by this one")
    args = parser.parse_args(argv)
    results = RESULTS / "results.json"
    done = json.loads(results.read_text())
    annotate_dev(done)
    chosen = choose(done)
    if chosen != {kind: dev_key for kind, dev_key, _ in TEST_CELLS.values()}:
        raise SystemExit(f"the dev choice {chosen} is not what TEST_CELLS measures on test: run the chosen cells")
    tokenizer = loading.load_tokenizer(smollm2.ensure())
    for cell in TEST_CELLS:
        for record in test_records(tokenizer, cell, RESULTS / f"test-probes-{cell}.jsonl"):
            done[f"test:{cell}:{record['probe']}"] = [record]
    results.write_text(json.dumps(done, indent=1) + "\n")
    (RESULTS / "headline.md").write_text(table(done, chosen))
    plot(done, RESULTS / "headline.png")
    print(table(done, chosen))
    for page in PAGES if args.write else ():
        glance.replace_block(page, "results", table(done, chosen).strip())


# the pages with a "results" block
PAGES = [ROOT / "README.md", ROOT / "docs" / "results" / "real-model.md", ROOT / ADAPTER / "README.md"]


if __name__ == "__main__":
    main()
