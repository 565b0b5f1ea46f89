"""The second GPU call's diagnosis of the bf16 gradient FAIL (output in ``diagnose.txt``), tidied from the one-off
script that ran (the same computations, in the same order).

    PYTHONPATH=. python3 docs/results/gpu/diagnose.py cuda     # from the repository root; "cpu" runs it here

A: the backward case of ``benchmarks/check_engines.py`` (1024 tokens, 32/8 heads, head_dim 128) for RoPER, xPos and
ReRoPE, each on a fresh module: the bf16 fast engine's q/k/v gradients against the float32 reference engine's.
B: torch's sdpa alone (no rope, causal, bf16) against float32 math, per backend, kv heads grouped or expanded.
C: a torch profile of one 8k ReRoPE and one DCA prefill (calls per operation, the most costly first): on CPU it
counts the 79 kernel calls of ReRoPE's row-block plan; on the GPU the call's time limit cut it off.
The engine it ran was commit a96c9fe's (before b894446 moved xPos/RoPER gradients off torch's sdpa).
"""

import sys
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from transformers import AttentionInterface

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import check_engines as ce  # noqa: E402
from bench_attention import TIMED, TYPES, attention_module, prefill, random, timed_sdpa  # noqa: E402

DEVICE = sys.argv[1]


def errors(got, expected) -> list[str]:
    return [f"{ce.error(g, r):.2e}" for g, r in zip(got, expected, strict=True)]


def engine_grads(name: str, dtype, implementation: str, length: int = 1024):
    """(q.grad, k.grad, v.grad) of one prefill through ``implementation`` ("sdpa": the fast engine)."""
    module = attention_module(TYPES[name], 128, DEVICE, dtype).train()
    pos = torch.arange(length, device=DEVICE)[None]
    weights = random((1, length, 32, 128), torch.float32, DEVICE, 3)
    q, k, v = (t.requires_grad_(True) for t in ce.tensors(1, length, length, 128, dtype, DEVICE))
    (ce.attend(implementation, module, q, k, v, None, pos).float() * weights).sum().backward()
    return q.grad, k.grad, v.grad


def sdpa_grads(dtype, backend, gqa: bool = True):
    """(q.grad, k.grad, v.grad) of torch's causal sdpa alone on ``backend``."""
    q = random((1, 32, 1024, 128), torch.float32, DEVICE, 0).to(dtype).requires_grad_(True)
    k, v = (random((1, 8, 1024, 128), torch.float32, DEVICE, s).to(dtype).requires_grad_(True) for s in (1, 2))
    weights = random((1, 32, 1024, 128), torch.float32, DEVICE, 3)
    keys, values = (k, v) if gqa else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=gqa)
        (out.float() * weights).sum().backward()
    return q.grad, k.grad, v.grad


def main() -> None:
    AttentionInterface.register(TIMED, timed_sdpa(DEVICE))
    for name in ("roper", "xpos", "rerope"):
        expected, got = engine_grads(name, torch.float32, "eager"), engine_grads(name, torch.bfloat16, "sdpa")
        print("A", name, "bf16 sdpa vs fp32 eager per grad q,k,v:", errors(got, expected), flush=True)
    expected = sdpa_grads(torch.float32, SDPBackend.MATH)
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        for gqa in (True, False):
            try:
                found = errors(sdpa_grads(torch.bfloat16, backend, gqa), expected)
            except RuntimeError as error:
                found = f"error {str(error)[:60]}"
            print("B raw sdpa bf16", backend.name, "gqa" if gqa else "expanded", found, flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    for name in ("rerope", "dual_chunk"):
        module = attention_module(TYPES[name], 128, DEVICE, torch.bfloat16)
        prefill(module, 8192, 128, torch.bfloat16, DEVICE)  # the first call compiles
        with profile(activities=activities) as prof:
            seconds = prefill(module, 8192, 128, torch.bfloat16, DEVICE)[0]
        print("C", name, f"8k prefill {seconds:.4f} s", flush=True)
        print(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60), flush=True
        )


if __name__ == "__main__":
    main()
