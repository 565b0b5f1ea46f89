"""Where one decode step's attention call spends its time: torch.profiler over the call, per attention-level type.

    PYTHONPATH=. python benchmarks/profile_decode.py [--cached 32768] [--types rerope dual_chunk] [--device cuda]

On an H200 a decode step of the package's types took 2-5 ms against plain sdpa's 0.15 ms (docs/results/gpu.md); with
block masks given to compiled flex, ReRoPE's step took 2.5 ms after 8k or 32k cached tokens, 0.28 ms of it on the
device: the rest is host work. ``decode_ops.py`` counts the operations on any device; this says which of them take
the time: the attention module of ``bench_attention`` (32 / 8 heads, head_dim
128, bf16) steps ``--steps`` times on a rotating cache holding ``--cached`` random tokens, and the last step's
attention call runs under the profiler. Printed per type: the call's wall time and the profiler's table of the
``--rows`` operations with the most CPU time and, on a GPU, those with the most device time, whose footer sums the
self CPU time and the device (kernel) time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as bench  # noqa: E402


def profiled_step(name: str, cached: int, steps: int, device: str):
    """(wall seconds, profile) of the last of ``steps`` decode steps' attention calls of ``name``."""
    found = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])

    def attention(module, *args, **kwargs):
        bench.LAST_CALL[:] = [(0.0, 0.0)]  # what bench.decode reads after each step
        if len(found) < steps:  # earlier steps: compile and warm up, unprofiled
            found.append(None)
            return ALL_ATTENTION_FUNCTIONS["sdpa"](module, *args, **kwargs)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            out = ALL_ATTENTION_FUNCTIONS["sdpa"](module, *args, **kwargs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        found.append((seconds, prof))
        return out

    AttentionInterface.register(bench.TIMED, attention)
    module = bench.attention_module(bench.TYPES[name], 128, device, torch.bfloat16)
    bench.decode(module, cached, 128, torch.bfloat16, device, steps=steps)  # steps + 1 calls: the last profiled
    return found[-1]


def summary(name: str, seconds: float, prof, device: str, rows: int) -> str:
    """The call's wall time, then the profiler's table by self CPU time (its footer sums the self CPU and device
    times) and, on a GPU, by device time too: a step whose device time is a fraction of its wall time is host work."""
    sorts = ["self_cpu_time_total"] + (["self_device_time_total"] if device.startswith("cuda") else [])
    tables = [prof.key_averages().table(sort_by=s, row_limit=rows, max_name_column_width=60) for s in sorts]
    heading = f"## {name}: wall {seconds * 1e3:.2f} ms (the attention call under the profiler)"
    return "\n".join([heading] + [f"by {s}:\n{t}" for s, t in zip(sorts, tables, strict=True)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cached", type=int, default=32768, help="tokens in the cache before the steps")
    parser.add_argument("--types", nargs="+", default=["rerope", "dual_chunk"], choices=list(bench.TYPES))
    parser.add_argument("--steps", type=int, default=3, help="unprofiled steps first (compile, warm-up)")
    parser.add_argument("--rows", type=int, default=15, help="operations listed per type")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    for name in args.types:
        seconds, prof = profiled_step(name, args.cached, args.steps, args.device)
        print(summary(name, seconds, prof, args.device, args.rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
