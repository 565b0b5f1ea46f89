"""How many torch operations one prefill attention call runs, per attention-level rope type and length.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/prefill_ops.py [--lengths 2048 4096 8192] [--cpu-pieces]
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/prefill_ops.py --one-pass-rotation
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/prefill_ops.py --fused

On a GPU a prefill's host work is the operations it dispatches (each a Python dispatch and, for a kernel, a launch);
where their number grows with the length, the host, not the kernels, can set the time at short lengths. This counts
them on any device, with a dispatch mode (``decode_ops.Counted``), for one call of the attention module of
``bench_attention`` (32 / 8 heads, bfloat16, ``--head-dim``) on random q, k, v of each length. By default the CPU
takes the CUDA path's plan: each band one piece of every row up to 8192 (``kernels.WHOLE_BANDS``), each piece
building the block mask compiled flex would get (``flex.kernel_block_mask``), the CPU kernel computing it;
``--cpu-pieces`` counts the CPU's own plan (row blocks, whose number grows with the length by design);
``--one-pass-rotation`` rotates every tensor in one pass (``rotation.ROWS`` unbounded: the count of the CUDA path,
which rotates a long tensor by one compiled kernel, ``rotation.one_pass``, here in the eager operations of the same
form); ``--fused`` lets the CUDA kernel's own code take torch's fused op first for the pieces it takes
(``dense_ops``; on CPU the CPU flash op, torch's choice here, standing in for cuDNN's or flash's, one operation as
theirs), block masks only for the others, as the CUDA kernel now runs. Per type: the operations at each length, the
host syncs at the longest, and what grows (operation kinds whose count rises from the shortest to the longest).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from unittest import mock

import torch
from torch.nn.attention import SDPBackend
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as bench  # noqa: E402
import decode_ops  # noqa: E402

from hf_rope_ext.attention import rotation  # noqa: E402
from hf_rope_ext.attention.engine import dense_ops, kernels  # noqa: E402


def cpu_stand_in(q, k, v, causal: bool, scale: float):
    """The CPU flash op in the place of a CUDA fused op: (out, lse) in one operation."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def cuda_kernel(fused: bool):
    """The CUDA path's kernel on a CPU: block masks built for flex's pieces, torch's fused op first if ``fused``."""
    flex_like = decode_ops.with_block_masks(kernels.cpu_flash)
    return kernels.fused_first(flex_like, "flex") if fused else flex_like


def prefill_ops(name: str, length: int, head_dim: int, cpu_pieces=False, fused=False) -> decode_ops.Counted:
    """The counter of a prefill attention call of ``name`` over ``length`` tokens (on the CPU), the layer's second."""
    if not cpu_pieces:
        whole = mock.patch.object(kernels, "WHOLE_BANDS", kernels.WHOLE_BANDS | {"cpu"})
        masks = mock.patch.dict(kernels.KERNELS, cpu=cuda_kernel(fused))
        ops = mock.patch.dict(dense_ops.OPS, {SDPBackend.FLASH_ATTENTION: cpu_stand_in})
        with whole, masks, ops:
            return prefill_ops(name, length, head_dim, cpu_pieces=True)
    AttentionInterface.register(bench.TIMED, bench.timed_sdpa("cpu"))
    module = bench.attention_module(bench.TYPES[name], head_dim, "cpu", torch.bfloat16)
    q = bench.random((1, bench.HEADS, length, head_dim), torch.bfloat16, "cpu", 0)
    k, v = (bench.random((1, bench.KV_HEADS, length, head_dim), torch.bfloat16, "cpu", s) for s in (1, 2))
    positions = torch.arange(length)[None]

    def call():
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, q, k, v, None, scaling=head_dim**-0.5, position_ids=positions)

    with torch.no_grad():
        call()  # the first call forms the layer's constants (its frequencies, the rotation's tag)
        with decode_ops.Counted(10**15) as counter:
            call()
    return counter


def growth(first: collections.Counter, last: collections.Counter, top: int = 4) -> str:
    """The operation kinds whose count rises most from ``first`` to ``last``: "kind a->b, ..."."""
    risen = sorted(((last[k] - first[k], k) for k in last if last[k] > first[k]), reverse=True)[:top]
    return ", ".join(f"{k.removeprefix('aten.')} {first[k]}->{last[k]}" for _, k in risen) or "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192], help="tokens per prefill")
    parser.add_argument("--types", nargs="+", default=[t for t in bench.TYPES if t != "default"], choices=bench.TYPES)
    parser.add_argument("--head-dim", type=int, default=64, help="head size (128 as the GPU figures: slower here)")
    parser.add_argument("--cpu-pieces", action="store_true", help="the CPU's own plan, not the CUDA path's")
    parser.add_argument("--one-pass-rotation", action="store_true", help="rotate each tensor in one pass")
    parser.add_argument("--fused", action="store_true", help="torch's fused op first, as the CUDA kernel takes it")
    args = parser.parse_args(argv)
    with mock.patch.object(rotation, "ROWS", 2**62 if args.one_pass_rotation else rotation.ROWS):
        table(args)
    return 0


def table(args) -> None:
    """The Markdown table: a row per type."""
    plan = "the CPU's row blocks" if args.cpu_pieces else "whole bands and flex block masks, as on CUDA"
    plan += ", fused ops first" if args.fused and not args.cpu_pieces else ""
    print(f"| rope_type ({plan}) | " + " | ".join(f"ops at {n}" for n in args.lengths) + " | host syncs | grows |")
    print("| --- |" + " ---: |" * len(args.lengths) + " ---: | --- |")
    for name in args.types:
        counters = [prefill_ops(name, n, args.head_dim, args.cpu_pieces, args.fused) for n in args.lengths]
        counts = " | ".join(str(sum(c.ops.values())) for c in counters)
        changed = growth(counters[0].ops, counters[-1].ops)
        print(f"| {name} | {counts} | {counters[-1].syncs} | {changed} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
