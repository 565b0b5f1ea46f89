"""The real-model report: SmolLM2-135M-Instruct (trained at 8192 tokens) read at 2x and 4x with training-free methods.

    .venv/bin/python experiments/real_model_report.py                       # every cell below, 5-6 h on 2 cores
    .venv/bin/python experiments/real_model_report.py --cells yarn:2 rerope:4 # some cells
    .venv/bin/python experiments/real_model_report.py --cells lora:4           # the shipped LoRA adapter

A cell is (method, factor s): the method with factor s (as ``hf-rope-ext extend`` sets its parameters) read at L0
and s x L0 tokens, measuring what ``extend`` measures on a real model: pass keys by greedy generation, several per
prompt (``--passkey-prompts``), perplexity and the far-context ratio on the python-docs documents (one document,
baseline: the model as saved through a sliding 8192-token window, stride 1024). Each cell is one call of
``hf_rope_ext.eval.compare.evaluate_method``, so ``hf-rope-ext extend --model <smollm2> --methods M --factors s
--documents 1 --last-chunk 0 --passkey-depths 0 --passkey-prompts P --far-stride 1024 --data python-docs --dtype
bfloat16`` reproduces any row. Results go to ``--out``/results.json after every cell (a rerun skips the cells
already there) and ``report.md`` (the README table). The ``lora`` cell reads the adapter of ``--adapter`` (default:
``examples/smollm2-self-extend-retrieval-lora``, trained by ``finetune`` with Self-Extend and PoSE; the others are in
``docs/results/adapters.md``) merged into its base, with the rope parameters it was trained under and the base model's
sliding-window baseline.

A method may carry an attention temperature: ``dual_chunk+log:4:1key`` runs ``dual_chunk`` with
``attention_temperature="log"`` (``+constant``: the constant (0.1 ln s + 1)^2 with s the cell's factor).
``--rope-param KEY=VALUE`` (repeatable) sets a parameter over the ``extend`` defaults for every cell of the call;
the cell is stored under its own key and row (``dual_chunk:2[chunk_size=8191,local_size=512] float32``), beside
the one with the defaults.
Results go to ``docs/results/real-model/`` by default, committed, so every README figure can be checked there.

Three keys per prompt test two things at once: finding a key far back and telling planted keys apart by the object
they name. A method that gives every distant token the same position (ReRoPE beyond its window) or a coarse one
(Self-Extend's groups) keeps the first and loses the second, so the ``:1key`` cells (``--cells rerope:2:1key``) ask
the classic question, one key per prompt and one forward per probe, at s x L0 only.

Two jobs side by side on a 2-core machine: give each ``OMP_NUM_THREADS=1`` (two 2-thread jobs wait on each other at
every operation; a generated token at 8k then took 2.4 s instead of 0.18 s;
``benchmarks/bench_decode_threads.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import time
from pathlib import Path

import torch

from hf_rope_ext.eval import compare, loading
from hf_rope_ext.eval.adapters import adapter_label
from hf_rope_ext.eval.data import load_token_documents, long_enough
from hf_rope_ext.eval.multikey import multikey_accuracy
from hf_rope_ext.eval.runner import EvalPlan, label
from hf_rope_ext.store import smollm2

# (method, factor, prompts of 3 keys): 7 prompts (21 probes) at 2x, 4 (12) at 4x; the PoSE pair and the headline
# cells first, so that a stopped run has them
CELLS = [
    ("lora", 4, 4),
    ("yarn", 4, 4),
    *[(m, 2, 7) for m in ("none", "self_extend", "rerope", "yarn")],
    *[(m, 4, 4) for m in ("self_extend", "rerope", "none", "leaky_rerope", "dynamic_yarn", "ntk_by_parts")],
    *[(m, 2, 7) for m in ("leaky_rerope", "dynamic_yarn", "ntk_by_parts", "ntk", "part_ntk", "dynamic", "linear")],
    *[(m, 4, 4) for m in ("ntk", "part_ntk", "dynamic", "linear")],
    ("lora", 2, 7),  # an adapter trained for 4x, read at 8k and 16k: the 2x three-key target after fine-tuning
]
# single-key cells "method:factor:1key" (method, factor, prompts of 1 key): the classic probe, one forward each, at
# s x L0 only; they separate finding a key from telling three planted keys apart (module docstring)
SINGLE = [(m, 2, 10) for m in ("rerope", "self_extend", "yarn", "none")]
SINGLE += [(m, 4, 10) for m in ("self_extend", "yarn", "rerope")]
# the newer training-free methods, alone and with an attention temperature: the classic probe first (cheapest)
NEWER = ("dual_chunk", "dual_chunk+log", "string", "string+constant", "self_extend+log")
SINGLE += [(m, s, 10) for s in (4, 2) for m in NEWER]
SINGLE += [(m, 4, 10) for m in ("rerope+log", "string+log")]  # the two other types with a 4x three-key temperature row
SINGLE += [("leaky_rerope", s, 10) for s in (4, 2)]  # the last training-free attention-level type's classic probe
SINGLE += [("lora", 4, 10), ("lora", 2, 10)]  # the adapter of --adapter, merged into its base
CELLS += [(m, s, 7 if s == 2 else 4) for s in (4, 2) for m in NEWER]
CELLS += [("rerope+log", 4, 4)]  # an older attention-level type with the temperature too
CELLS += [("string+log", 4, 4)]  # STRING at 4x with the temperature of DCA and Qwen
# the rest of the grid "every attention-level type, with and without the temperature": the older types and STRING
# with the log temperature at 2x, Leaky ReRoPE with it at 4x
LOGGED = ("rerope+log", "leaky_rerope+log", "string+log")
SINGLE += [(m, 2, 10) for m in LOGGED] + [("leaky_rerope+log", 4, 10)]
CELLS += [(m, 2, 7) for m in LOGGED] + [("leaky_rerope+log", 4, 4)]
TEMPERATURES = ("log", "constant")
ADAPTER = Path(__file__).resolve().parent.parent / "examples" / "smollm2-self-extend-retrieval-lora"
FAR_STRIDE = 1024
RESULTS = "docs/results/real-model"  # committed: the figures behind README's real-model table
COMMAND = (
    "hf-rope-ext extend --model {model} --methods {method} --factors {factor} --documents 1 --last-chunk 0 "
    "--passkey-depths 0 --passkey-prompts {prompts} --far-stride 1024 --data python-docs --dtype {dtype}"
)
SINGLE_COMMAND = "python experiments/real_model_report.py --cells {method}:{factor}:1key --dtype {dtype}"
DTYPES = ("bfloat16", "float32")  # float32: an 8k forward in 0.6 of the time of bf16 on this 2-core CPU


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


def baseline(folder, config, documents, factor: int, done: dict, dtype: str) -> float:
    """The sliding-window baseline loss for windows of factor x L0 tokens (computed once per dtype, kept in
    ``done``)."""
    key = f"baseline:{factor}" + ("" if dtype == "bfloat16" else f":{dtype}")
    if key not in done:
        done[key] = compare.far_context_baseline(folder, config, documents, [factor], plan(0), dtype)
    return done[key]


def merged(adapter: Path, base: Path) -> Path:
    """The adapter merged into its base (its config's rope parameters kept), saved once in the package's cache (not
    beside the committed results), under its name and the hash of its weights (an adapter retrained under the same
    name is merged anew)."""
    from hf_rope_ext.store.from_gguf import cache_root
    from hf_rope_ext.train.prepare import load_adapter

    weights = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()[:12]
    target = cache_root() / "merged" / f"{adapter.name}-{weights}"
    if not (target / "config.json").is_file():  # written aside, then renamed: two jobs never read a half
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        load_adapter(str(adapter), base=str(base)).merge_and_unload().save_pretrained(partial)
        loading.load_tokenizer(base).save_pretrained(partial)
        if (target / "config.json").is_file():  # another job got there first
            shutil.rmtree(partial)
        else:
            shutil.rmtree(target, ignore_errors=True)  # a broken earlier write
            partial.rename(target)
    return target


def split_method(method: str, factor: float, chosen: dict) -> tuple[str | None, dict, str]:
    """'type[+temperature]' and the --rope-param values -> (rope_type or None, extra rope parameters, the row's
    label)."""
    rope_type, extra, name = temperature_of(method, factor)
    return rope_type, {**extra, **chosen}, name + "".join(f" {k}={v}" for k, v in chosen.items())


def temperature_of(method: str, factor: float) -> tuple[str | None, dict, str]:
    """'type[+temperature]' -> (rope_type or None, the temperature's rope parameters, the row's label)."""
    name, _, temperature = method.partition("+")
    rope_type = None if name in ("none", "lora") else name
    if not temperature:
        return rope_type, {}, label(rope_type)
    if temperature not in TEMPERATURES:
        raise ValueError(f"cell method {method!r}: the temperature after '+' must be one of {list(TEMPERATURES)}")
    extra = {"attention_temperature": temperature}
    extra |= {"temperature_factor": float(factor)} if temperature == "constant" else {}
    return rope_type, extra, f"{label(rope_type)} + {temperature} temperature"


def shown(adapter: Path) -> str:
    """The adapter as a cell's command names it: relative to the repository when inside it (examples/...)."""
    root = ADAPTER.parents[1]
    return str(adapter.resolve().relative_to(root)) if adapter.resolve().is_relative_to(root) else str(adapter)


def row_name(name: str, dtype: str) -> str:
    """The table row of a cell: the method's label, and "(float32)" where the cell did not run in bf16."""
    return name if dtype == "bfloat16" else f"{name} (float32)"


def run_single_key_cell(folder, config, tokenizer, cell, adapter: Path, dtype: str, chosen: dict) -> list[dict]:
    """Pass keys by generation with one key per prompt, at factor x L0 tokens only (no perplexity, no 8k run); the
    ``lora`` cell reads the adapter merged into its base, with the rope parameters it was trained with."""
    method, factor, prompts = cell
    rope_type, extra, name = split_method(method, factor, chosen)
    params = compare.run_parameters(config, rope_type, float(factor), 8192, extra)
    start = time.perf_counter()
    if method == "lora":
        folder, name = merged(adapter, folder), adapter_label(adapter)
    model = loading.load_model(folder, params, dtype=getattr(torch, dtype))
    found = multikey_accuracy(model, tokenizer, factor * 8192, prompts, keys=1)
    record = {"rope_type": row_name(name, dtype), "length": factor * 8192, "rope_parameters": params, **found}
    extra = {"cell_seconds": round(time.perf_counter() - start), "threads": torch.get_num_threads()}
    extra |= {"keys_per_prompt": 1, "cell_factor": factor}
    extra |= {"dtype": dtype, "adapter": adapter.name} if method == "lora" else {"dtype": dtype}
    return [{**record, **extra, "command": single_command(cell, dtype, chosen, adapter)}]


def single_command(cell, dtype: str, chosen: dict, adapter: Path) -> str:
    """The command that reruns a ``:1key`` cell: its flags, then the number of keys as a comment."""
    method, factor, prompts = cell
    command = SINGLE_COMMAND.format(method=method, factor=factor, dtype=dtype) + loading.rope_param_flags(chosen)
    return command + (f" --adapter {shown(adapter)}" if method == "lora" else "") + f"  # {prompts} keys"


def run_cell(folder, config, tokenizer, documents, cell, done: dict, adapter: Path, dtype: str, chosen: dict):
    method, factor, prompts = cell
    far = baseline(folder, config, documents, factor, done, dtype)
    rope_type, extra, name = split_method(method, factor, chosen)
    model = merged(adapter, folder) if method == "lora" else folder
    start = time.perf_counter()
    args = (documents, rope_type, [float(factor)], plan(prompts), True, extra or None, far, dtype)
    records = compare.evaluate_method(model, config, tokenizer, *args)
    if method == "lora" or extra:
        records = [{**r, "rope_type": adapter_label(adapter) if method == "lora" else name} for r in records]
    records = [{**r, "rope_type": row_name(r["rope_type"], dtype)} for r in records]
    extra = {
        "dtype": dtype,
        "cell_seconds": round(time.perf_counter() - start),
        "threads": torch.get_num_threads(),  # the time of a cell is that of this many threads
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "command": COMMAND.format(model="<smollm2>", method=rope_type, factor=factor, prompts=prompts, dtype=dtype)
        + loading.rope_param_flags(extra)
        if method != "lora"
        else f"python experiments/real_model_report.py --cells lora:{factor} --adapter {shown(adapter)} "
        f"--dtype {dtype}",
    }
    return [{**r, "cell_factor": factor, **extra} for r in records]


def table(done: dict) -> str:
    """Rows: method; columns: pass keys at 8k (per factor)/16k/32k, far-context ratio and perplexity at 16k/32k."""
    rows = [r for key, value in done.items() if not key.startswith("baseline:") and ":1key" not in key for r in value]
    methods = list(dict.fromkeys(r["rope_type"] for r in rows))
    lines = [
        "| method | pass keys 8k (factor) | 16k (2x) | 32k (4x) | far ratio 16k | far ratio 32k | ppl 16k | ppl 32k |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        mine = [r for r in rows if r["rope_type"] == method]
        lines.append(f"| {method} | " + " | ".join(cells_of(mine)) + " |")
    return "\n".join(lines) + single_key_table(done)


def single_key_table(done: dict) -> str:
    """Rows: method; columns: pass keys found with one key per prompt at 16k and 32k."""
    rows = [r for key, value in done.items() if ":1key" in key for r in value]
    if not rows:
        return ""
    lines = ["", "", "| method | one key per prompt: 16k (2x) | 32k (4x) |", "|---|---:|---:|"]
    for method in dict.fromkeys(r["rope_type"] for r in rows):
        mine = [r for r in rows if r["rope_type"] == method]
        lines.append(f"| {method} | {cells_of_length(mine, 16384)} | {cells_of_length(mine, 32768)} |")
    return "\n".join(lines)


def cells_of_length(records: list[dict], length: int) -> str:
    """Pass keys found at ``length``, pooled over the records that measured it: "hits/probes"."""
    found = [r for r in records if r["length"] == length and "multikey_accuracy" in r]
    hits = sum(r["multikey_accuracy"] * r["multikey_probes"] for r in found)
    return f"{hits:.0f}/{sum(r['multikey_probes'] for r in found)}" if found else "-"


def cells_of(records: list[dict]) -> list[str]:
    def at(length, value, fmt):
        if value == "multikey_accuracy":
            return cells_of_length(records, length)
        found = [r for r in records if r["length"] == length and value in r]
        return format(found[0][value], fmt) if found else "-"

    def at_8k():  # one entry per cell: the method with factor 2 and with factor 4 are different models at 8k
        factors = sorted({r["cell_factor"] for r in records if r["length"] == 8192})
        mine = [(f, [r for r in records if r.get("cell_factor") == f]) for f in factors]
        return " · ".join(f"{cells_of_length(rs, 8192)} (x{f})" for f, rs in mine) or "-"

    return (
        [at_8k(), at(16384, "multikey_accuracy", ""), at(32768, "multikey_accuracy", "")]
        + [at(n, "far_context_ratio", ".3f") for n in (16384, 32768)]
        + [at(n, "perplexity", ".2f") for n in (16384, 32768)]
    )


def stored_key(key: str, adapter: Path, dtype: str, chosen: dict) -> str:
    """The cell's key in results.json: a ``lora`` cell names its adapter ("lora@NAME:4:1key"), parameters of
    --rope-param follow in brackets ("dual_chunk:2[chunk_size=8191]") and a float32 cell says so ("yarn:4:1key
    float32"), so such cells sit beside the others."""
    if key.startswith("lora:"):
        key = key.replace("lora:", f"lora@{adapter.name}:", 1)
    key += "[" + ",".join(f"{k}={v}" for k, v in chosen.items()) + "]" if chosen else ""
    return key if dtype == "bfloat16" else f"{key} {dtype}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: SmolLM2 from `hf-rope-ext get-smollm2`)")
    parser.add_argument("--cells", nargs="+", default=None, help="method:factor cells to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / RESULTS)
    parser.add_argument("--adapter", type=Path, default=ADAPTER, help="the adapter of the lora cell")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="the models' dtype (default: bfloat16)")
    parser.add_argument("--rope-param", action="append", default=[], help="KEY=VALUE (JSON) over the defaults")
    args = parser.parse_args()
    chosen = loading.parse_rope_params(args.rope_param)
    folder = Path(args.model) if args.model else smollm2.ensure()
    config, tokenizer = loading.load_config(folder), loading.load_tokenizer(folder)
    documents = long_enough(load_token_documents(tokenizer, "python-docs"), 4 * 8192, 1)
    named = {f"{c[0]}:{c[1]}": c for c in CELLS} | {f"{c[0]}:{c[1]}:1key": c for c in SINGLE}
    unknown = sorted(set(args.cells or ()) - set(named))
    if unknown:
        parser.error(f"--cells {unknown}: allowed {sorted(named)}")
    wanted = list(named) if args.cells is None else args.cells  # in the order given
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    done = json.loads(results.read_text()) if results.is_file() else {}
    for wanted_key in wanted:
        cell = named[wanted_key]
        key = stored_key(wanted_key, args.adapter, args.dtype, chosen)
        if key not in done:
            done[key] = (
                run_single_key_cell(folder, config, tokenizer, cell, args.adapter, args.dtype, chosen)
                if wanted_key.endswith(":1key")
                else run_cell(folder, config, tokenizer, documents, cell, done, args.adapter, args.dtype, chosen)
            )
            results.write_text(json.dumps(done, indent=1) + "\n")
            print(f"{key}: {done[key][-1]['cell_seconds']} s", flush=True)
        (args.out / "report.md").write_text(table(done) + "\n")
    print(table(done))


if __name__ == "__main__":
    main()
