"""The headline of the real-model results: on SmolLM2-135M-Instruct (trained at 8192 tokens) at 4x (32768 tokens),
the best training-free configuration and the best adapter, chosen on the dev split and measured once on the held-out
test split.

    python experiments/headline.py            # choose on dev, score the test logs, write the table and the chart
    python experiments/headline.py --write    # and put the table into README, the results page and the adapter's card

1. The choice: among the 4x cells of ``docs/results/real-model/results.json`` (every earlier figure, all on the dev
   probe), those with both dev probes at 32768 tokens (the classic one key per prompt, and three keys per prompt),
   the one with the most hits over both, training-free and with an adapter apart.
2. The test cells and their controls (the same keys at 8192 and 4096 tokens, the chat template) are run by
   ``hf-rope-ext eval --probes ... --split test --log ...`` (each record names its command) and read back from their
   logs by ``headline_controls.py``, however far they got: every logged prompt is checked against the split's prompt
   of the same id (its tokens' hash) before its probes count. The dev cells of the two chosen configurations are
   re-run and scored by the same rule (``dev-probes-<cell>.jsonl``); the choice stands whatever they show.
3. Written: ``results.json`` gains ``split``, ``multikey_hits`` and ``multikey_interval`` on every dev record that
   lacks them, the test records under ``test:<cell>:<probe>``, the controls under ``control:<cell>:<probe>`` and the
   dev re-runs under ``dev-rerun:<cell>:<probe>``; ``headline.md`` (the table), ``headline.png`` (the chart) and
   ``controls.md`` (per wording, chat template, paired tests). A target counts as met only where the interval's lower
   bound clears it.
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
import headline_controls as controls  # noqa: E402
import headline_replay as replay  # noqa: E402
import log_history  # noqa: E402
import results_at_a_glance as glance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "real-model"
LENGTH = 32768
SAMPLES = controls.SAMPLES  # prompts per probe on test: 30 keys, 24 x 3 = 72 keys
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


def table(done: dict, chosen: dict) -> str:
    """Markdown: per chosen configuration and probe, dev, test at 4x and the same keys at 1x (``headline_controls``),
    the target's verdict on test (by the interval that fits the probe)."""
    lines = [
        "| configuration | probe | dev, 4x (chosen on it) | test, 4x (held out) | same keys at 1x, this configuration "
        "| same keys at 1x, model as saved | kept | gained | 4x vs as saved at 1x | target | on test |",
        "|---|---|---|---|---|---|---|---|---|---:|---|",
    ]
    columns, dev_shown_cells = controls.headline_columns(controls.keys_of(done)), []
    for cell, (kind, dev_key, _) in TEST_CELLS.items():
        dev = dev_cells(done).get(dev_key, {})
        for probe in SAMPLES:
            shown_dev = dev_shown(done.get(f"dev-rerun:{cell}:{probe}", [None])[0], dev.get(probe))
            dev_shown_cells.append(shown_dev)
            c = columns[CONFIGURATION[cell], probe]
            met = verdict(c["record"], TARGETS[kind]) if c["record"]["n"] else "-"
            lines.append(
                f"| {label(done, dev_key)} | {probe} | {shown_dev} | {c['test']} | {c['1x']} | {c['saved']} "
                f"| {c['kept']} | {c['gained']} | {c['paired']} | {TARGETS[kind]:.0%} | {met} |"
            )
    chose = ", ".join(f"{kind}: `{name}`" for kind, name in chosen.items())
    return "\n".join(lines) + "\n\n" + notes(chose, dev_shown_cells) + "\n"


def notes(chose: str, dev_shown_cells: list[str]) -> str:
    """The table's notes: what was chosen and how every count is scored; the first rule's note while a dev cell
    scored by it (marked *) is shown."""
    starred = any(text.endswith(" *") for text in dev_shown_cells)
    return NOTES.format(chose=chose) + (STARRED if starred else "")


NOTES = (
    "Chosen on dev before the test run (most hits over both probes at 32768 tokens): {chose}; the choice stands "
    "whatever a re-run of dev shows. Base weights: the Q4_1 GGUF dequantized; float32; plain-text prompts, no chat "
    "template. One rule scores every count: the answer starts, after spaces, with exactly the key. Classic: 30 "
    "prompts of one key, Wilson 95% intervals; multikey: 24 prompts of three keys (the first 8 measured before, 16 "
    "added; the 24-prompt result replaces the 8-prompt one whatever it shows), intervals marked (by prompt): Wilson "
    'with n = the number of prompts (its coverage simulated in docs/results/real-model/coverage.md). "Same keys at '
    '1x": the '
    "test prompts told in 8192 tokens (the model's training length) with the same keys, objects, wordings and "
    "depths. Kept: of the keys the model as saved finds at 1x, those found at 4x; gained: of the keys it misses, those "
    "found at 4x. The column after them: keys found only at 4x (+) and only by the model as saved at 1x (-), with "
    "the exact two-sided p over prompts (a prompt's keys together; McNemar's for classic)."
)
STARRED = " Dev cells marked * were scored by the first rule (the answer starts with the key, 6 tokens generated)."
CONFIGURATION = {"se": "self_extend", "se-lora": "self_extend + LoRA"}  # headline_controls' configuration names


def dev_shown(rerun: dict | None, first: dict | None) -> str:
    """The dev cell re-run under ``is_hit`` where logged, else the first record, marked *."""
    if rerun is not None:
        return shown(rerun) + controls.by_prompt_mark(rerun) + progress(rerun)
    return shown(dev_of(first)) + " *" if first is not None else "-"


def dev_records(tokenizer, cell: str) -> dict:
    """results.json's ``dev-rerun:<cell>:<probe>``: the dev cell re-run and scored by ``is_hit``, from
    ``dev-probes-<cell>.jsonl``, where it has lines."""
    out = {}
    for probe, n in DEV_SAMPLES.items():
        found = controls.logged(
            RESULTS / f"dev-probes-{cell}.jsonl", splits.prompts(tokenizer, "dev", probe, LENGTH, n)
        )
        if found:
            tokens = [len(prompt.ids) for _, prompt, _ in found]
            record = probes.aggregate("dev", probe, LENGTH, [x["probes"] for *_, x in found], tokens)
            if probe == "multikey":  # keys of one prompt are not independent draws: the interval is by prompt
                per_prompt = [(sum(hit for *_, hit in x["probes"]), len(x["probes"])) for *_, x in found]
                record |= controls.by_prompt(per_prompt)
            command = DEV_EVAL.format(model=MODEL, flags=TEST_CELLS[cell][2], probe=probe, n=n, cell=cell)
            run = controls.commits([x.get("provenance") for *_, x in found])
            out[f"dev-rerun:{cell}:{probe}"] = [record | {"planned": n, "command": command, "run": run}]
    return out


DEV_SAMPLES = {"classic": 10, "multikey": 4}  # the dev cells the choice was made on: 10 keys, 4 x 3 keys
DEV_EVAL = EVAL.replace("--split test", "--split dev").replace("test-probes", "dev-probes")


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
    """Points with 95% error bars (Wilson; multikey: Wilson by prompt): per configuration and
    probe, dev, test and the same keys at 1x side by side."""
    from hf_rope_ext.eval.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.4))
    rows = [(cell, probe) for cell in TEST_CELLS for probe in SAMPLES]
    series = [(-0.24, "dev", "tab:grey"), (-0.08, "test", "tab:blue"), (0.08, "1x", "tab:green")]
    for shift, split, colour in [*series, (0.24, "as saved 1x", "tab:orange")]:
        labelled = False
        for i, (cell, probe) in enumerate(rows):
            record = split_record(done, cell, probe, split)
            if record is not None:
                lo, hi = record["interval"]
                y = record["hits"] / record["n"]
                ax.errorbar(i + shift, y, yerr=[[y - lo], [hi - y]], fmt="o", color=colour, capsize=4,
                            label=None if labelled else LEGEND[split])  # fmt: skip
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
    ax.set_ylabel("pass keys found")
    ax.set_title("SmolLM2-135M at 4x: chosen on dev, measured on test, the same keys at 1x (95% intervals)", fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


LEGEND = {
    "dev": "dev, 32768 (chosen on it)",
    "test": "test, 32768 (held out)",
    "1x": "same keys at 8192",
    "as saved 1x": "same keys at 8192, model as saved",
}


def split_record(done: dict, cell: str, probe: str, split: str) -> dict | None:
    """The record a point of the chart shows (None where it has no keys yet)."""
    if split == "dev":
        rerun = done.get(f"dev-rerun:{cell}:{probe}", [None])[0]
        dev = dev_cells(done).get(TEST_CELLS[cell][1], {})
        return rerun if rerun is not None else dev_of(dev[probe]) if probe in dev else None
    name = {"test": f"{cell}-32768", "1x": f"{cell}-8192", "as saved 1x": "as-saved-8192"}[split]
    record = done.get(controls.record_key(name, probe), [None])[0]
    return record if record is not None and record["n"] else None


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
    PROMPTS.write_text(json.dumps(prompt_list(tokenizer), indent=1) + "\n")
    done |= controls.records(tokenizer)  # the test records at 4x and their controls
    for cell in TEST_CELLS:
        done |= dev_records(tokenizer, cell)
    results.write_text(json.dumps(done, indent=1) + "\n")
    history = {"4x lines": log_history.time_range([controls.CELLS[name].log for name in controls.RECORDED_AS])}
    history["replay"] = replay.section(replay.compare(replay.chosen_ids()))
    controls.HISTORY.write_text(json.dumps(history, indent=1) + "\n")
    controls.PAGE.write_text(controls.page(done, history))
    (RESULTS / "headline.md").write_text(table(done, chosen))
    plot(done, RESULTS / "headline.png")
    print(table(done, chosen))
    for page in PAGES if args.write else ():
        glance.replace_block(page, "results", table(done, chosen).strip())


PROMPTS = RESULTS / "test-prompts.json"


def prompt_list(tokenizer) -> dict[str, dict[str, list]]:
    """cell -> probe -> [prompt_id, prompt_sha] of every test prompt the cell counts (``controls.read_log`` counts a
    logged line only for these very tokens): the list committed before the runs that fill it."""
    out = {}
    for name, cell in controls.CELLS.items():
        out[name] = {}
        for probe in SAMPLES:
            chosen = splits.prompts(
                tokenizer, "test", probe, cell.length, cell.samples(probe), cell.seeds_of, cell.chat
            )
            out[name][probe] = [[p.prompt_id, probes.prompt_sha(p)] for p in chosen]
    return out


# the pages with a "results" block
PAGES = [ROOT / "README.md", ROOT / "docs" / "results" / "real-model.md", ROOT / ADAPTER / "README.md"]


if __name__ == "__main__":
    main()
