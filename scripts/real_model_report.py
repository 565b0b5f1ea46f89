"""The real-model report: SmolLM2-135M-Instruct (trained at 8192 tokens) read at 2x and 4x with training-free methods.

    .venv/bin/python scripts/real_model_report.py                       # every cell below, about 5 h on 2 cores
    .venv/bin/python scripts/real_model_report.py --cells yarn:2 rerope:4 # some cells
    .venv/bin/python scripts/real_model_report.py --cells lora:4           # the shipped PoSE LoRA adapter

A cell is (method, factor s): the method with factor s (as ``hf-rope-ext extend`` sets its parameters) read at L0
and s x L0 tokens, measuring what ``extend`` measures on a real model: pass keys by greedy generation, several per
prompt (``--passkey-prompts``), perplexity and the far-context ratio on the python-docs documents (one document,
baseline: the model as saved through a sliding 8192-token window, stride 1024). Each cell is one call of
``hf_rope_ext.extend.evaluate_method``, so ``hf-rope-ext extend --model <smollm2> --methods M --factors s
--documents 1 --last-chunk 0 --passkey-depths 0 --passkey-prompts P --far-stride 1024 --data python-docs --dtype
bfloat16`` reproduces any row. Results go to ``--out``/results.json after every cell (a rerun skips the cells
already there) and ``report.md`` (the README table). The ``lora`` cell reads the adapter of ``--adapter`` (default:
``examples/smollm2-yarn4-pose-lora``, trained by ``finetune`` with yarn x4 and PoSE) merged into its base, with the
base model's sliding-window baseline.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from hf_rope_ext import extend, smollm2
from hf_rope_ext.eval import loading
from hf_rope_ext.eval.data import load_token_documents, long_enough
from hf_rope_ext.eval.runner import EvalPlan

# (method, factor, prompts of 3 keys): the PoSE pair and the headline cells first, so that a stopped run has them
CELLS = [
    ("lora", 4, 4),
    ("yarn", 4, 4),
    *[(m, 2, 7) for m in ("none", "self_extend", "rerope", "yarn")],
    *[(m, 4, 2) for m in ("self_extend", "rerope", "none", "leaky_rerope", "dynamic_yarn", "ntk_by_parts")],
    *[(m, 2, 2) for m in ("leaky_rerope", "dynamic_yarn", "ntk_by_parts", "ntk", "part_ntk", "dynamic", "linear")],
    *[(m, 4, 1) for m in ("ntk", "part_ntk", "dynamic", "linear")],
]
ADAPTER = Path(__file__).resolve().parent.parent / "examples" / "smollm2-yarn4-pose-lora"
FAR_STRIDE = 1024
COMMAND = (
    "hf-rope-ext extend --model {model} --methods {method} --factors {factor} --documents 1 --last-chunk 0 "
    "--passkey-depths 0 --passkey-prompts {prompts} --far-stride 1024 --data python-docs --dtype bfloat16"
)


def plan(prompts: int) -> EvalPlan:
    return EvalPlan(
        lengths=(2,),  # replaced per run by evaluate_method
        documents=1,
        last_chunk=None,
        passkey_depths=0,
        far_context=True,
        far_stride=FAR_STRIDE,
        multikey_prompts=prompts,
    )


def baseline(folder, config, documents, factor: int, done: dict) -> float:
    """The sliding-window baseline loss for windows of factor x L0 tokens (computed once, kept in ``done``)."""
    key = f"baseline:{factor}"
    if key not in done:
        done[key] = extend.far_context_baseline(folder, config, documents, [factor], plan(0), "bfloat16")
    return done[key]


def merged(adapter: Path, base: Path, out: Path) -> Path:
    """The adapter merged into its base (its config's rope parameters kept), saved once under ``out``."""
    from hf_rope_ext.train.prepare import load_adapter

    target = out / f"merged-{adapter.name}"
    if not (target / "config.json").is_file():
        model = load_adapter(str(adapter), base=str(base)).merge_and_unload()
        model.save_pretrained(target)
        loading.load_tokenizer(base).save_pretrained(target)
    return target


def run_cell(folder, config, tokenizer, documents, cell, done: dict, adapter: Path, out: Path) -> list[dict]:
    method, factor, prompts = cell
    far = baseline(folder, config, documents, factor, done)
    rope_type = None if method in ("none", "lora") else method
    model = merged(adapter, folder, out) if method == "lora" else folder
    start = time.perf_counter()
    args = (documents, rope_type, [float(factor)], plan(prompts), True, None, far, "bfloat16")
    records = extend.evaluate_method(model, config, tokenizer, *args)
    if method == "lora":
        records = [{**r, "rope_type": "yarn x4 + PoSE LoRA"} for r in records]
    extra = {
        "cell_seconds": round(time.perf_counter() - start),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "command": COMMAND.format(model="<smollm2>", method=method, factor=factor, prompts=prompts)
        if method != "lora"
        else f"python scripts/real_model_report.py --cells lora:4 --adapter {adapter}",
    }
    return [{**r, "cell_factor": factor, **extra} for r in records]


def table(done: dict) -> str:
    """Rows: method; columns: pass keys at 8k/16k/32k, far-context ratio at 16k/32k, the cells' seconds."""
    rows = [r for key, value in done.items() if not key.startswith("baseline:") for r in value]
    methods = list(dict.fromkeys(r["rope_type"] for r in rows))
    lines = [
        "| method | pass keys 8k | 16k (2x) | 32k (4x) | far ratio 16k | far ratio 32k | ppl 16k | ppl 32k |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        mine = [r for r in rows if r["rope_type"] == method]
        lines.append(f"| {method} | " + " | ".join(cells_of(mine)) + " |")
    return "\n".join(lines)


def cells_of(records: list[dict]) -> list[str]:
    def at(length, value, fmt):
        found = [r for r in records if r["length"] == length and value in r]
        if not found:
            return "-"
        if value == "multikey_accuracy":  # pooled over the runs that measured this length
            hits = sum(r[value] * r["multikey_probes"] for r in found)
            probes = sum(r["multikey_probes"] for r in found)
            return f"{hits:.0f}/{probes}"
        return format(found[0][value], fmt)

    keys = [at(n, "multikey_accuracy", "") for n in (8192, 16384, 32768)]
    return (
        keys
        + [at(n, "far_context_ratio", ".3f") for n in (16384, 32768)]
        + [at(n, "perplexity", ".2f") for n in (16384, 32768)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: SmolLM2 from `hf-rope-ext get-smollm2`)")
    parser.add_argument("--cells", nargs="+", default=None, help="method:factor cells to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("runs/real-model"))
    parser.add_argument("--adapter", type=Path, default=ADAPTER, help="the adapter of the lora cell")
    args = parser.parse_args()
    folder = Path(args.model) if args.model else smollm2.ensure()
    config, tokenizer = loading.load_config(folder), loading.load_tokenizer(folder)
    documents = long_enough(load_token_documents(tokenizer, "python-docs"), 4 * 8192, 1)
    named = {f"{c[0]}:{c[1]}": c for c in CELLS}
    unknown = sorted(set(args.cells or ()) - set(named))
    if unknown:
        parser.error(f"--cells {unknown}: allowed {sorted(named)}")
    wanted = CELLS if args.cells is None else [named[c] for c in args.cells]  # in the order given
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    done = json.loads(results.read_text()) if results.is_file() else {}
    for cell in wanted:
        key = f"{cell[0]}:{cell[1]}"
        if key not in done:
            done[key] = run_cell(folder, config, tokenizer, documents, cell, done, args.adapter, args.out)
            results.write_text(json.dumps(done, indent=1) + "\n")
            print(f"{key}: {done[key][-1]['cell_seconds']} s", flush=True)
        (args.out / "report.md").write_text(table(done) + "\n")
    print(table(done))


if __name__ == "__main__":
    main()
