"""Compiled decode on a StaticCache, each type against plain RoPE compiled the same way, each row naming its kernels.

    PYTHONPATH=. python benchmarks/bench_compiled_decode.py [--cached 32768] [--types rerope xpos] [--json PATH]

1. ``graphed``: the attention module of ``bench_attention`` (32 / 8 heads, head_dim 128, ``--dtype``: bf16) on a
   StaticCache holding ``--cached`` random tokens (the rotating one ``generate`` gives these types) and one
   uncompiled step on it (as ``generate``'s prefill: a static layer's turned rows written), its forward
   (projections, cache write, attention) compiled with ``torch.compile(fullgraph=True, mode=--mode)``: on CUDA
   ``reduce-overhead``, a CUDA graph replayed every step. First the check: the compiled first step against the same
   step uncompiled on a copy of the cache (max |error| / max |output|; past ``--bound`` the row says FAIL and the
   script exits 3). Then ``--steps`` timed steps after ``--warmup`` ones (median ms per step, with its quartiles and
   the step count), and one profiled step: the kernels with the most device time (CPU: operations with the most CPU
   time) name what ran.
2. ``generate``: a Llama of ``--model-shape`` (``1b``: Llama 3.2 1B's shape, random weights), or the saved
   model of ``--model`` (its rope switched to each type with this script's parameters), reading a
   ``--prompt``-token prompt and generating ``--new-tokens`` greedy tokens with ``cache_implementation="static"``
   (transformers compiles the decode step itself on CUDA, with its default CompileConfig), for ``--model-types``
   and plain. First the compiled run's tokens against the uncompiled run's (``disable_compile``): how many new tokens
   agree before the first that differs (in bfloat16 the two runs' kernels round differently, so near-tied logits
   (a random model's, a random prompt's) may part them, plain's too; ``--dtype float32`` shows whether they agree
   where rounding does not part them; the graphed check above is the bound). Then decode tokens/s =
   (N - 1) / (time from the first new token to the N-th), each stamped as ``generate`` chooses it (a stopping
   criterion that never stops, the device synchronized), so the prompt's forward is not in it; ``--repeats`` runs
   after the compiled run of N (the median, with its quartiles; the prompt's forward is recorded apart), and as many
   uncompiled ones (the eager step through ``generate``: ``eager_tokens_per_s``). ``--prompt-once`` (long prompts on
   a slow machine): each row reads its prompt once, into one static cache (``hf_rope_ext.rope_cache``); every later
   run crops it back to the prompt less its last token and reads that token alone before its steps.
On a CPU (``--device cpu``: toy sizes, the tests) transformers is told to compile too (``_compile_all_devices``)
with ``--backend`` (default ``eager``) and no mode.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from torch.profiler import ProfilerActivity, profile
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    AutoModelForCausalLM,
    CompileConfig,
    LlamaConfig,
    LlamaForCausalLM,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.cache_utils import StaticLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

import hf_rope_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as bench  # noqa: E402

GQA_PLAIN = "default_gqa"  # plain RoPE through sdpa reading each kv head once: the GQA-aware plain step
GQA_SDPA = "hf_rope_ext_bench_sdpa_gqa"  # its attention implementation
EAGER = {"disable_compile": True, "compile_config": None}  # generate's switches for an uncompiled run
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
CHECK_FAILED = 3  # the exit status when a compiled step is off its uncompiled one (a crash exits 1)
SHAPES = {  # Llama shapes: hidden, layers, heads, kv heads, intermediate, vocab
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256, head_dim=64),
    "toy": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=96, vocab_size=97, head_dim=16),
}  # fmt: skip


def sdpa_gqa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' sdpa step without its copy of the keys and values for every query head (``repeat_kv``, which
    it makes whenever a mask is given): query [B, H, q, d] against key and value [B, Hkv, kv, d] (``enable_gqa``);
    returns [B, q, H, d]."""
    mask = None if attention_mask is None else attention_mask[:, :, :, : key.shape[-2]]
    causal = mask is None and query.shape[2] > 1
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, is_causal=causal, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def rope_of(name: str, args) -> dict:
    """The rope parameters of row ``name`` (the GQA-aware plain row: plain RoPE's), with ``--rope-param``'s values
    for the keys it has."""
    params = bench.TYPES["default" if name == GQA_PLAIN else name]
    return {**params, **{k: v for k, v in args.rope_param.items() if k in params}}


def rope_param(text: str) -> tuple[str, float]:
    """``KEY=VALUE`` (a number) of ``--rope-param``."""
    key, _, value = text.partition("=")
    try:
        return key, float(value) if "." in value else int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rope-param {text!r}: expected KEY=NUMBER, e.g. window=16") from None


def attention_of(name: str) -> str:
    return GQA_SDPA if name == GQA_PLAIN else "sdpa"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def kernels_ran(function, device: str, count: int = 3) -> str:
    """The ``count`` kernels (CPU: operations) with the most self time in one call of ``function``, with shares."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        function()
        sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0 and (not cuda or e.device_type.name == "CUDA")]
    total = sum(getattr(e, key) for e in events) or 1
    top = sorted(events, key=lambda e: -getattr(e, key))[:count]
    return ", ".join(f"{e.key[:60]} {100 * getattr(e, key) / total:.0f}%" for e in top)


def compile_options(args) -> dict:
    return {"backend": args.backend, **({"mode": args.mode} if args.mode else {})}


def graphed_row(name: str, args) -> dict:
    """Check, time and profile ``name``'s compiled decode step (module docstring, 1)."""
    dtype, head_dim = DTYPES[args.dtype], args.head_dim
    module = bench.attention_module(rope_of(name, args), head_dim, args.device, dtype)
    module.config._attn_implementation = attention_of(name)
    room = args.cached + args.warmup + args.steps + 3  # the uncompiled step, the checked one, the profiled one
    cache = hf_rope_ext.rope_cache(module.bench_config, max_cache_len=room)
    kv = [bench.random((1, bench.KV_HEADS, args.cached, head_dim), dtype, args.device, s) for s in (1, 2)]
    cache.update(*kv, module.layer_idx)
    keyword = hf_rope_ext.cache_keyword(module)
    position = [args.cached]

    def step(hidden, pos, mask, held):
        return module(hidden, module.bench_rotary(hidden, pos), mask, position_ids=pos, **{keyword: held})[0]

    def inputs():
        hidden = bench.random((1, 1, bench.HEADS * head_dim), dtype, args.device, position[0])
        pos = torch.tensor([[position[0]]], device=args.device)
        mask = (torch.arange(room, device=args.device) <= position[0])[None, None, None]
        position[0] += 1
        return hidden, pos, mask

    compiled = torch.compile(step, fullgraph=True, dynamic=False, **compile_options(args))
    with torch.no_grad():
        step(*inputs(), cache)  # uncompiled, as generate's prefill: a static layer's turned rows written
    first = inputs()
    with torch.no_grad():
        expected = step(*first, copy.deepcopy(cache)).float()
        got = compiled(*first, cache).float()  # compiles
        error = float((got - expected).abs().max() / expected.abs().max())
        for _ in range(args.warmup):
            compiled(*inputs(), cache)
        times = []
        for _ in range(args.steps):
            now = inputs()
            sync(args.device)
            start = time.perf_counter()
            compiled(*now, cache)
            sync(args.device)
            times.append(time.perf_counter() - start)
        kernels = kernels_ran(lambda: compiled(*inputs(), cache), args.device)
    what = {"pass": "graphed", "tokens": args.cached, "rope_type": name, "mode": args.mode, "backend": args.backend}
    what.update(dtype=args.dtype, rope_parameters=rope_of(name, args))
    spread = {"ms": 1e3 * statistics.median(times), "ms_quartiles": quartiles(times), "steps": len(times)}
    return {**what, **spread, "error": error, "ok": error <= args.bound, "kernels": kernels}


def quartiles(values: list[float], unit: float = 1e3) -> list[float]:
    """[first, third] quartile of ``values`` times ``unit`` (seconds to ms by default; one value: itself twice)."""
    scaled = [unit * v for v in values]
    return [scaled[0], scaled[0]] if len(scaled) < 2 else statistics.quantiles(scaled, n=4)[::2]


def model_of(name: str, args):
    """The generate pass's model: a saved one (``--model``, its rope switched to ``name`` with the benchmark's
    parameters) or a Llama of ``--model-shape`` with random weights, bf16, sdpa."""
    if args.model:
        params = {k: v for k, v in rope_of(name, args).items() if k != "rope_type"}
        switched = rope_of(name, args)["rope_type"] != "default"
        rope = {"rope_parameters": hf_rope_ext.rope_parameters_for(args.model, name, **params)} if switched else {}
        options = dict(dtype=DTYPES[args.dtype], attn_implementation=attention_of(name), **rope)
        return AutoModelForCausalLM.from_pretrained(args.model, **options).to(args.device).eval()
    rope = {"rope_theta": 500000.0, **rope_of(name, args)}
    shape = SHAPES[args.model_shape]
    config = LlamaConfig(**shape, max_position_embeddings=4096, rope_parameters=rope, tie_word_embeddings=True)
    config._attn_implementation = attention_of(name)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=args.device, dtype=DTYPES[args.dtype]).eval()


class Stamps(StoppingCriteria):
    """Never stops ``generate``; records when each new token is chosen (the first: after the prompt's forward)."""

    def __init__(self, device: str):
        self.device, self.times = device, []

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        sync(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate_row(name: str, args) -> dict:
    """Decode tokens/s of ``generate`` on a static cache, compiled and eager (module docstring, 2)."""
    model = model_of(name, args)
    ids = torch.randint(3, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    run = generate_runs(model, ids.to(args.device), args)
    first_prompt_s, uncompiled, first_eager = timed(run, args.device, **EAGER)
    compiled = timed(run, args.device)[1]  # compiles the decode step
    runs = [timed(run, args.device) for _ in range(args.repeats)]  # (prompt s, tokens, tokens/s)
    eager_rates = [first_eager] + [timed(run, args.device, **EAGER)[2] for _ in range(args.repeats - 1)]
    kernels = kernels_ran(run, args.device)
    rates = [r[2] for r in runs]
    # --prompt-once: the runs after the first read one token, so the prompt's time is the first run's
    prompt_s = first_prompt_s if args.prompt_once else statistics.median(r[0] for r in runs)
    what = {"pass": "generate", "tokens": args.prompt, "new_tokens": args.new_tokens, "rope_type": name}
    what.update(dtype=args.dtype, rope_parameters=rope_of(name, args), prompt_once=args.prompt_once, prefill_s=prompt_s)
    spread = {"tokens_per_s": statistics.median(rates), "tokens_per_s_quartiles": quartiles(rates, 1.0)}
    eager = {"eager_tokens_per_s": statistics.median(eager_rates), "eager_quartiles": quartiles(eager_rates, 1.0)}
    agree = agreeing(compiled, uncompiled, ids.shape[1])
    checks = {"repeats": len(rates), "tokens_agree": agree, "kernels": kernels}
    return {**what, "shape": args.model or args.model_shape, **spread, **eager, **checks}


def generate_runs(model, ids: torch.Tensor, args):
    """``run(stamps=None, **switch)``: ``generate`` of ``--new-tokens`` greedy tokens after ``ids`` [1, P] on a
    static cache. ``--prompt-once``: one cache (``hf_rope_ext.rope_cache``) reads the prompt in the first run; each
    later run cuts it back to the prompt less its last token (``crop``) and reads that token alone before its steps."""
    options = dict(do_sample=False, pad_token_id=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    if not args.device.startswith("cuda"):
        config = CompileConfig(fullgraph=True, backend=args.backend)
        config._compile_all_devices = True
        options["compile_config"] = config
    held = hf_rope_ext.rope_cache(model, max_cache_len=args.prompt + args.new_tokens) if args.prompt_once else None

    def run(stamps=None, **switch) -> torch.Tensor:
        if held is None:
            switch = {"cache_implementation": "static", **switch}
        else:
            held.crop(min(0, ids.shape[1] - 1 - int(held.get_seq_length())))  # a static layer crops by -tokens
            switch = {hf_rope_ext.cache_keyword(model): held, **switch}
        criteria = {} if stamps is None else {"stopping_criteria": StoppingCriteriaList([stamps])}
        with torch.no_grad():
            out = model.generate(ids, **{**options, **criteria, **switch})
        sync(args.device)
        return out

    return run


def timed(run, device: str, **switch) -> tuple[float, torch.Tensor, float]:
    """(seconds to the first new token, the tokens, decode tokens/s: (N - 1) / (time from the first new token to the
    N-th)) of ``run(stamps, **switch)``."""
    stamps = Stamps(device)
    start = time.perf_counter()
    out = run(stamps, **switch)
    return stamps.times[0] - start, out, (len(stamps.times) - 1) / (stamps.times[-1] - stamps.times[0])


def agreeing(got: torch.Tensor, expected: torch.Tensor, prompt: int) -> int:
    """How many new tokens [B, N] of ``got`` equal ``expected``'s before the first that differs (N: all)."""
    same = (got[:, prompt:] == expected[:, prompt:]).all(0).long()  # [N]
    return int(same.cumprod(0).sum())


def slower(r: dict, base: dict | None) -> str:
    """How many times slower record ``r`` is than ``base`` of its pass (generate: base's tokens/s over r's)."""
    if base is None:
        return "-"
    if r["pass"] == "graphed":
        return f"{r['ms'] / base['ms']:.2f}"
    rate, plain = r["tokens_per_s"], base["tokens_per_s"]
    return f"{plain / rate:.2f}" if rate and plain else "nan"


def table(records: list[dict]) -> list[str]:
    """One row per record, each type's ratio to plain and to the GQA-aware plain of its pass (where run), above 1
    slower."""
    head = "| pass | tokens | rope_type | ms/step or tokens/s (quartiles, samples) | x plain | x GQA plain | check |"
    lines = [head + " kernels |", "| --- " * 8 + "|"]
    for r in records:
        plain, gqa = (next((p for p in records if p["pass"] == r["pass"] and p["rope_type"] == t), None)
                      for t in ("default", GQA_PLAIN))  # fmt: skip
        if r["pass"] == "graphed":
            q1, q3 = r["ms_quartiles"]
            value = f"{r['ms']:.3f} ms ({q1:.3f}-{q3:.3f}, n={r['steps']})"
            check = f"{r['error']:.1e}" + ("" if r["ok"] else " FAIL")
        else:
            rate = r["tokens_per_s"]
            q1, q3 = r.get("tokens_per_s_quartiles", [rate, rate])
            value = f"{rate or 0:.1f} tok/s ({q1:.1f}-{q3:.1f}, n={r.get('repeats', 1)})"
            value += f"; eager {r['eager_tokens_per_s']:.1f}" if "eager_tokens_per_s" in r else ""
            n, agree = r["new_tokens"], r["tokens_agree"]
            check = "same tokens" if agree == n else f"same first {agree} of {n} tokens"
        lines.append(f"| {r['pass']} | {r['tokens']} | {r['rope_type']} | {value} | {slower(r, plain)} | "
                     f"{slower(r, gqa)} | {check} | {r['kernels']} |")  # fmt: skip
    return lines


def parse(argv=None):
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--cached", type=int, default=32768, help="tokens in the StaticCache before the steps")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES), help="of the module and the models")
    rows = [*bench.TYPES, GQA_PLAIN]
    parser.add_argument("--types", nargs="+", default=rows, choices=rows)
    parser.add_argument("--warmup", type=int, default=3, help="compiled steps before timing (CUDA graph recorded)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--backend", default="inductor" if cuda else "eager")
    parser.add_argument("--mode", default="reduce-overhead" if cuda else None)
    parser.add_argument("--bound", type=float, default=2**-6, help="largest relative error of the compiled step")
    parser.add_argument("--model-types", nargs="*", default=["rerope", "self_extend"], choices=rows)
    parser.add_argument("--model-shape", default="1b", choices=list(SHAPES))
    parser.add_argument("--model", help="a saved model folder for the generate pass instead of --model-shape")
    parser.add_argument("--prompt", type=int, default=32768, help="prompt tokens of the generate pass")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1, help="timed generate runs, compiled and eager each")
    parser.add_argument("--prompt-once", action="store_true", help="read the prompt once per row, crop after runs")
    parser.add_argument("--rope-param", type=rope_param, action="append", default=[], metavar="KEY=VALUE",
                        help="set this rope parameter of every row that has it (e.g. window=16)")  # fmt: skip
    parser.add_argument("--json", help="also write every record here")
    args = parser.parse_args(argv)
    args.rope_param = dict(args.rope_param)
    known = sorted({key for params in bench.TYPES.values() for key in params} - {"rope_type"})
    for key in sorted(set(args.rope_param) - set(known)):
        parser.error(f"--rope-param {key}: no row has it; allowed: {', '.join(known)}")
    if args.prompt_once and not hasattr(StaticLayer, "crop"):
        parser.error(f"--prompt-once crops a static cache; transformers {transformers.__version__} cannot")
    args.types = ["default", *(t for t in args.types if t != "default")]
    args.model_types = ["default", *(t for t in args.model_types if t != "default")] if args.model_types else []
    return args


def write(args, records: list[dict]) -> None:
    """The records so far and their table into ``--json`` (after every row: a run cut off keeps what it measured)."""
    if args.json:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        meta = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__}
        done = {**meta, "records": records, "table": table(records)}
        Path(args.json).write_text(json.dumps(done, indent=2), encoding="utf-8")


def main(argv=None) -> int:
    args = parse(argv)
    AttentionInterface.register(bench.TIMED, bench.timed_sdpa(args.device))  # the modules are built with it
    AttentionInterface.register(GQA_SDPA, sdpa_gqa)
    AttentionMaskInterface.register(GQA_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    records = []
    for name in args.types:
        torch._dynamo.reset()  # each row compiles afresh (the same step code, past dynamo's recompile limit else)
        records.append(graphed_row(name, args))
        print(f"  graphed {name}: {records[-1]['ms']:.3f} ms, error {records[-1]['error']:.1e}", flush=True)
        write(args, records)
    for name in args.model_types:
        torch._dynamo.reset()
        records.append(generate_row(name, args))
        print(f"  generate {name}: {records[-1]['tokens_per_s']} tokens/s", flush=True)
        write(args, records)
    print("\n".join(table(records)))
    failed = [r["rope_type"] for r in records if r["pass"] == "graphed" and not r["ok"]]
    if failed:
        print(f"FAIL: the compiled step is off the uncompiled one past {args.bound} for {failed}", file=sys.stderr)
    return CHECK_FAILED if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
