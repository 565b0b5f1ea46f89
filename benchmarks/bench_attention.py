"""Time and peak memory of each attention-level rope type's attention call as ratios to plain RoPE's sdpa.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_attention.py \\
        --lengths 2048 8192 16384 --decode 4096 16384 --head-dims 64 128 --dtypes float32 bfloat16

Real attention shapes: 32 query heads, 8 kv heads, head_dim 64 or 128, batch 1. Each rope type gets the attention
module of a one-layer Llama whose config names it, and the call is the one transformers makes:
``ALL_ATTENTION_FUNCTIONS["sdpa"](module, q, k, v, None, scaling=..., position_ids=...)``, with plain RoPE
(``default``) going to transformers' own sdpa function (its q/k would be rotated by the model; rotation is
elementwise and not timed here, while the package's types rotate inside the call and pay for it).
- prefill: q/k/v of ``length`` tokens, no mask (causal), positions 0..length-1;
- decode: one new token per step against a transformers ``DynamicCache`` filled with ``--decode`` random keys and
  values, with the rotating layers ``generate`` gives these types (``hf_rope_ext.rope_cache``; ``--plain-cache``:
  the cache as transformers builds it, which the package compares before reusing rows): each step runs the
  attention module's own forward (projections, cache update), and only its attention-function call is timed
  (through an attention implementation registered for the benchmark that times the ``"sdpa"`` one); per-token
  time is the median of ``--steps`` steps after a first step (which fills the rotated rows and is not counted);
- decode-static (``--decode-static``): the same with a ``StaticCache`` of room for exactly the steps taken, each
  step given the mask transformers builds for it (the filled slots), plain RoPE included.
Every (type, case) is measured once per repeat, types interleaved within each repeat, ``--repeats`` repeats; the
table gives min and median over repeats (the machine may be shared: min is the better estimate of the cost).
``--json PATH`` also writes every (case, rope type) record. Each row names the kernels its call ran (the first call
of a case: a prefill's first repeat, a decode's uncounted first step), with the number of calls of each: torch's
sdpa as the backend torch picked for it (``sdpa:cudnn_attention``, ``sdpa:flash_attention``...: plain's, and the
one-band types' single calls), the package's pieces by kernel (``kernels.RAN``: ``cudnn_attention`` and the like for
torch's fused ops called directly, ``flex``, ``cpu_flash``).
Peak memory: CUDA ``max_memory_allocated`` above the start; CPU the process's peak resident set (VmHWM, reset
through /proc/self/clear_refs) above the resident set at the start, with glibc told to return every freed block
of 64 KiB or more to the system at once (``MALLOC_MMAP_THRESHOLD_``, set by re-running itself), so that the
peak of one call is not hidden by memory freed earlier.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

import hf_rope_ext  # registers the rope types
from hf_rope_ext.attention.engine import kernels

WINDOW = 512
TYPES = {
    "default": {"rope_type": "default"},
    "rerope": {"rope_type": "rerope", "window": WINDOW},
    "leaky_rerope": {"rope_type": "leaky_rerope", "window": WINDOW, "factor": 16.0},
    "self_extend": {"rope_type": "self_extend", "window": WINDOW, "group_size": 8},
    "xpos": {"rope_type": "xpos", "scale_base": 512.0},
    "roper": {"rope_type": "roper", "value_rotary_factor": 1.0},
    "string": {"rope_type": "string", "window": 1024, "local_window": 128},
    "dual_chunk": {"rope_type": "dual_chunk", "chunk_size": 3072, "local_size": 256},
}
HEADS, KV_HEADS = 32, 8


TIMED = "hf_rope_ext_bench_timed_sdpa"  # the attention implementation the decode steps run through
LAST_CALL: list[tuple[float, float]] = []  # (seconds, peak MiB) of the last timed attention call


def timed_sdpa(device: str):
    """An attention function calling whatever is registered as "sdpa" (the package's), timed by ``timed`` (its
    kernels named at a decode's first step: ``module.bench_name``)."""

    def attention(module, *args, **kwargs):
        result = []
        call = lambda: result.append(ALL_ATTENTION_FUNCTIONS["sdpa"](module, *args, **kwargs))  # noqa: E731
        LAST_CALL[:] = [timed(call, device, module.bench_name)]
        return result[0]

    return attention


SDPA = torch.nn.functional.scaled_dot_product_attention
NAMED: Counter[str] = Counter()  # kernels run while ``naming`` (torch's sdpa by its backend, the package's pieces)
NAMING = [False]


def named_sdpa(*args, **kwargs):
    """torch's sdpa; while naming, the backend torch picks for the call is counted (its own choice function)."""
    if NAMING[0]:
        NAMED["sdpa:" + SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name.lower()] += 1
    return SDPA(*args, **kwargs)


def naming(function):
    """``function`` run once with the kernels it runs counted into ``NAMED``."""
    before = kernels.RAN.copy()
    NAMING[0] = True
    try:
        return function()
    finally:
        NAMING[0] = False
        NAMED.update(kernels.RAN - before)


def kernel_names(counts: Counter) -> str:
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) or "-"


def attention_module(rope: dict, head_dim: int, device: str, dtype: torch.dtype):
    """The attention module of a one-layer Llama (32 / 8 heads, pretrained length 4096) using ``rope``, with
    ``bench_rotary`` (the model's rotary module) and ``bench_config`` attached for the decode steps."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=HEADS * head_dim,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )
    config._attn_implementation = TIMED
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval().model
    module = model.layers[0].self_attn
    module.bench_rotary, module.bench_config = model.rotary_emb, config
    return module


def resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"/proc/self/status has no {field}")


def reset_peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")
    return resident_kib("VmRSS") * 1024


def peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return resident_kib("VmHWM") * 1024


def timed(function, device: str, name: bool = False) -> tuple[float, float]:
    """(seconds, peak MiB above the start) of one call (``name``: its kernels counted into ``NAMED``)."""
    start_bytes = reset_peak(device)
    start = time.perf_counter()
    with torch.no_grad():
        naming(function) if name else function()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, (peak(device) - start_bytes) / 2**20


def random(shape, dtype, device, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


def prefill(module, length: int, head_dim: int, dtype, device: str, name=False) -> tuple[float, float]:
    q = random((1, HEADS, length, head_dim), dtype, device, 0)
    k, v = (random((1, KV_HEADS, length, head_dim), dtype, device, s) for s in (1, 2))
    pos = torch.arange(length, device=device)[None]
    function = ALL_ATTENTION_FUNCTIONS["sdpa"]
    return timed(lambda: function(module, q, k, v, None, scaling=head_dim**-0.5, position_ids=pos), device, name)


def decode(module, cached: int, head_dim: int, dtype, device: str, steps: int, static=False, plain=False):
    """Median seconds and max peak MiB per token (of the attention call) over ``steps`` steps after a first,
    uncounted one, through the module's forward with a DynamicCache (or a StaticCache) holding ``cached`` tokens:
    the rotating cache of ``hf_rope_ext.rope_cache``, or with ``plain`` transformers' own."""
    room = cached + steps + 1
    config = module.bench_config
    if plain:
        cache = StaticCache(config=config, max_cache_len=room) if static else DynamicCache(config=config)
    else:
        cache = hf_rope_ext.rope_cache(config, max_cache_len=room if static else None)
    cache.update(*(random((1, KV_HEADS, cached, head_dim), dtype, device, s) for s in (1, 2)), module.layer_idx)
    results = []
    for step in range(steps + 1):
        hidden = random((1, 1, HEADS * head_dim), dtype, device, 10 + step)
        pos = torch.tensor([[cached + step]], device=device)
        mask = (torch.arange(room, device=device) <= cached + step)[None, None, None] if static else None
        module.bench_name = step == 0  # the uncounted first step names the kernels
        with torch.no_grad():
            keyword = {hf_rope_ext.cache_keyword(module): cache}  # past_key_values up to 5.23, cache from 5.24
            module(hidden, module.bench_rotary(hidden, pos), mask, position_ids=pos, **keyword)
        module.bench_name = False
        results.append(LAST_CALL[0])
    seconds = statistics.median(r[0] for r in results[1:])
    return seconds, max(r[1] for r in results[1:])


def cases(args) -> list[tuple[int, str, str, int]]:
    """(head_dim, dtype, kind, length) in the order measured."""
    return [
        (head_dim, dtype, kind, length)
        for head_dim in args.head_dims
        for dtype in args.dtypes
        for kind, lengths in (("prefill", args.lengths), ("decode", args.decode), ("decode-static", args.decode_static))
        for length in lengths
    ]


def measure_case(args, case) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str]]:
    """(per type, (seconds, peak MiB) of each repeat; per type, the kernels its first call ran)."""
    head_dim, dtype_name, kind, length = case
    dtype = getattr(torch, dtype_name)
    modules = {name: attention_module(TYPES[name], head_dim, args.device, dtype) for name in args.types}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in args.types}
    names: dict[str, str] = {}
    for repeat in range(args.repeats):
        for name in args.types:  # interleaved: every type once per repeat
            NAMED.clear()
            if kind == "prefill":
                results[name].append(prefill(modules[name], length, head_dim, dtype, args.device, repeat == 0))
            else:
                static = kind == "decode-static"
                results[name].append(
                    decode(modules[name], length, head_dim, dtype, args.device, args.steps, static, args.plain_cache)
                )
            names[name] = names.get(name) or kernel_names(NAMED)
            print(f"  {case} {name}: {results[name][-1][0]:.4f} s, {results[name][-1][1]:.0f} MiB", flush=True)
    return results, names


def records(case, results, names) -> list[dict]:
    """One record per rope type of a case: times (min and median over repeats), ratios to plain, peak MiB."""
    head_dim, dtype, kind, length = case
    base = results["default"]
    base_min, base_med = min(r[0] for r in base), statistics.median(r[0] for r in base)
    base_mem = min(r[1] for r in base)
    found = []
    for name, runs in results.items():
        t_min, t_med, mem = min(r[0] for r in runs), statistics.median(r[0] for r in runs), min(r[1] for r in runs)
        ratios = {"ratio_min": t_min / base_min, "ratio_median": t_med / base_med}
        peak = {"peak_mib": mem, "peak_ratio": mem / base_mem if base_mem >= 1 else None}  # below 1 MiB: not measured
        what = {"pass": kind, "tokens": length, "head_dim": head_dim, "dtype": dtype, "rope_type": name}
        found.append({**what, "time_min_s": t_min, "time_median_s": t_med, **ratios, **peak, "kernels": names[name]})
    return found


def table_rows(found: list[dict]) -> list[str]:
    return [
        f"| {r['head_dim']} | {r['dtype']} | {r['pass']} | {r['tokens']} | {r['rope_type']} | {r['time_min_s']:.4f} | "
        f"{r['ratio_min']:.2f} | {r['ratio_median']:.2f} | {r['peak_mib']:.0f} | "
        + (f"{r['peak_ratio']:.2f} |" if r["peak_ratio"] is not None else "- |")
        + f" {r['kernels']} |"
        for r in found
    ]


def compact_row(found: list[dict]) -> str:
    """One row of the summary: plain's time, then per type time ratio (min) / peak ratio."""
    base = next(r for r in found if r["rope_type"] == "default")
    others = [r for r in found if r is not base]
    cells = [f"{r['ratio_min']:.2f}" + (f" / {r['peak_ratio']:.2f}" if r["peak_ratio"] else "") for r in others]
    head = f"| {base['pass']} | {base['tokens']} | {base['head_dim']} | {base['dtype']} | {base['time_min_s']:.4f} | "
    return head + " | ".join(cells) + " |"


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[2048, 8192, 16384], help="prefill lengths")
    parser.add_argument("--decode", type=int, nargs="*", default=[4096, 16384], help="cache lengths for decode")
    parser.add_argument("--decode-static", type=int, nargs="*", default=[], help="the same with a StaticCache")
    parser.add_argument("--plain-cache", action="store_true", help="decode with transformers' caches as built")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=list(TYPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="decode steps counted per measurement")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write every record (case, rope type, times, ratios, peak) here")
    args = parser.parse_args(argv)
    if "default" not in args.types:
        args.types = ["default", *args.types]
    return args


def main(argv=None) -> int:
    if not torch.cuda.is_available() and os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    args = parse(argv)
    torch.set_num_threads(args.threads)
    AttentionInterface.register(TIMED, timed_sdpa(args.device))
    torch.nn.functional.scaled_dot_product_attention = named_sdpa
    lines = [
        "| head_dim | dtype | pass | tokens | rope_type | time (s, min) | x plain (min) | x plain (median) | "
        "peak MiB | x plain peak | kernels (calls) |",
        "| ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    others = [name for name in args.types if name != "default"]
    summary = [
        "| pass | tokens | head_dim | dtype | plain s (min) | " + " | ".join(others) + " |",
        "| --- | ---: | ---: | --- | ---: | " + " | ".join("---:" for _ in others) + " |",
    ]
    found = []
    for case in cases(args):
        new = records(case, *measure_case(args, case))
        lines += table_rows(new)
        summary.append(compact_row(new))
        found += new
    print(f"\n{args.device}, {args.threads} thread(s), {args.repeats} interleaved repeats, window {WINDOW}")
    print("\n".join(lines))
    print("\nx plain sdpa: time (min over repeats) / peak memory (prefill)")
    print("\n".join(summary))
    if args.json:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        meta = dict(device=device, torch=torch.__version__, threads=args.threads, repeats=args.repeats, window=WINDOW)
        Path(args.json).write_text(json.dumps({**meta, "records": found}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
