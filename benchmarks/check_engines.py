"""Does the fast engine on this device give the reference engine's outputs? One error per type, case and dtype.

    PYTHONPATH=. .venv/bin/python benchmarks/check_engines.py --device cuda [--json OUT.json]

For every attention-level rope type (``bench_attention.TYPES``: the attention module
of a one-layer Llama, 32 / 8 heads, L0 4096), the call transformers makes is run through the fast engine (on CUDA:
torch's fused op for the pieces it takes, compiled flex_attention over block masks for the others, the kernels that
ran named per type and dtype; ``dual_chunk`` with a mask runs the reference engine) and compared with
the reference engine (``"eager"``: dense scores) run in float32 on the same inputs:
- ``prefill``: ``--length`` tokens, no mask; ``padded``: a batch of 2, the second left-padded by a quarter, a 4D
  bool mask (as sdpa gets it);
- ``flash`` and ``flex``: the padded batch as transformers hands it to ``"flash_attention_2"`` (a 2D mask) and to
  ``"flex_attention"`` (a BlockMask), both routed to the same engine;
- ``decode``: ``--steps`` single queries after ``--length`` cached keys;
- ``backward``: the gradients of q, k, v through the prefill of ``--grad-length`` tokens.
The error is max |fast - reference| / max |reference| over the output (or each gradient). A float32 error above
``--fp32-bound`` (default 1e-3: the TF32 products a GPU kernel may use) or a bfloat16 one above ``--bf16-bound``
(default 2^-7, two bfloat16 steps), twice that for gradients, is printed as FAIL, and the script exits 1 after the
whole table. On CUDA the check is of the compiled kernel: a call that dynamo would run uncompiled (past the
package's recompile limit, ``util.recompile_limit``) stops the script with dynamo's error instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import (  # noqa: E402
    HEADS,
    KV_HEADS,
    TIMED,
    TYPES,
    attention_module,
    kernel_names,
    random,
    timed_sdpa,
)
from transformers import AttentionInterface  # noqa: E402

from hf_rope_ext.attention import function  # noqa: E402
from hf_rope_ext.attention.engine import kernels  # noqa: E402


def padded_masks(batch: int, length: int, device):
    """(2D keep [B, L] bool, 4D causal-and-kept [B, 1, L, L] bool): the last row left-padded by a quarter."""
    keep = torch.ones(batch, length, dtype=torch.bool, device=device)
    keep[-1, : length // 4] = False
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return keep, causal[None, None] & keep[:, None, None, :]


def flex_mask(keep: torch.Tensor):
    """The BlockMask transformers builds for ``"flex_attention"``: causal and the padding."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q, kv):
        return (kv <= q) & keep[b, kv]

    batch, length = keep.shape
    return create_block_mask(mask_mod, batch, None, length, length, device=keep.device)


def tensors(batch: int, q_len: int, kv: int, head_dim: int, dtype, device, grad=False):
    q = random((batch, HEADS, q_len, head_dim), dtype, device, 0)
    k, v = (random((batch, KV_HEADS, kv, head_dim), dtype, device, seed) for seed in (1, 2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def error(got: torch.Tensor, expected: torch.Tensor, valid=None) -> float:
    got, expected = got.float(), expected.float()
    if valid is not None:
        got, expected = got[valid], expected[valid]
    return float((got - expected).abs().max() / expected.abs().max())


def attend(implementation, module, q, k, v, mask, pos):
    return function.attend(implementation, module, q, k, v, mask, scaling=q.shape[-1] ** -0.5, position_ids=pos)[0]


def forward_cases(module, args, dtype) -> dict[str, float]:
    """{case: error} of the forward cases."""
    device, length, head_dim = args.device, args.length, args.head_dim
    found = {}
    pos = torch.arange(length, device=device)[None]
    q, k, v = tensors(1, length, length, head_dim, dtype, device)
    reference = attend("eager", module, q.float(), k.float(), v.float(), None, pos)
    found["prefill"] = error(attend("sdpa", module, q, k, v, None, pos), reference)
    keep, mask = padded_masks(2, length, device)
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    q, k, v = tensors(2, length, length, head_dim, dtype, device)
    reference = attend("eager", module, q.float(), k.float(), v.float(), mask, positions)
    valid = keep  # [B, L]: padded rows' outputs are not compared
    for case, implementation, given in (("padded", "sdpa", mask), ("flash", "flash_attention_2", keep)):
        found[case] = error(attend(implementation, module, q, k, v, given, positions), reference, valid)
    found["flex"] = error(attend("flex_attention", module, q, k, v, flex_mask(keep), positions), reference, valid)
    return found


def decode_case(module, args, dtype) -> float:
    """The largest error over ``--steps`` decode steps on a growing cache (rotated rows remembered)."""
    steps, cached = args.steps, args.length
    q, k, v = tensors(1, steps, cached + steps, args.head_dim, dtype, args.device)
    worst = 0.0
    for step in range(steps):
        kv = cached + step + 1
        pos = torch.tensor([[kv - 1]], device=args.device)
        one = (q[:, :, step : step + 1], k[:, :, :kv], v[:, :, :kv])
        reference = attend("eager", module, *(t.float() for t in one), None, pos)
        worst = max(worst, error(attend("sdpa", module, *one, None, pos), reference))
    return worst


def backward_case(module, args, dtype) -> float:
    """The largest error over the gradients of q, k and v of one prefill."""
    length = args.grad_length
    pos = torch.arange(length, device=args.device)[None]
    weights = random((1, length, HEADS, args.head_dim), torch.float32, args.device, 3)
    grads = {}
    for implementation, cast in (("sdpa", dtype), ("eager", torch.float32)):
        inputs = tensors(1, length, length, args.head_dim, dtype, args.device)
        q, k, v = (t.to(cast).requires_grad_(True) for t in inputs)
        (attend(implementation, module.train(), q, k, v, None, pos).float() * weights).sum().backward()
        grads[implementation] = (q.grad, k.grad, v.grad)
    module.eval()
    return max(error(g, e) for g, e in zip(grads["sdpa"], grads["eager"], strict=True))


def check(args) -> list[dict]:
    AttentionInterface.register(TIMED, timed_sdpa(args.device))  # the implementation bench_attention's modules name
    records = []
    for name in args.types:
        rope = TYPES[name]
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            module, before = attention_module(rope, args.head_dim, args.device, dtype), kernels.RAN.copy()
            with torch.no_grad():
                errors = {**forward_cases(module, args, dtype), "decode": decode_case(module, args, dtype)}
            errors["backward"] = backward_case(module, args, dtype)
            ran = kernel_names(kernels.RAN - before)
            print(f"{name:13s} {dtype_name:9s} kernels: {ran}", flush=True)
            for case, value in errors.items():
                bound = (args.fp32_bound if dtype == torch.float32 else args.bf16_bound) * (
                    2 if case == "backward" else 1
                )
                what = {"rope_type": name, "dtype": dtype_name, "case": case}
                records.append({**what, "error": value, "bound": bound, "kernels": ran})
                verdict = "ok" if value <= bound else "FAIL"
                print(f"{name:13s} {dtype_name:9s} {case:9s} {value:.2e} (bound {bound:.1e}) {verdict}", flush=True)
    return records


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=4096, help="prefill tokens and cached keys (default 4096)")
    parser.add_argument("--grad-length", type=int, default=1024, help="prefill tokens of the backward case")
    parser.add_argument("--steps", type=int, default=3, help="decode steps")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    checked = [name for name in TYPES if name != "default"]  # plain RoPE is transformers' own call: nothing to check
    parser.add_argument("--types", nargs="+", default=checked, choices=checked)
    parser.add_argument("--fp32-bound", type=float, default=1e-3)
    parser.add_argument("--bf16-bound", type=float, default=2**-7)
    parser.add_argument("--json", type=Path, help="write every record here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.device.startswith("cuda") and hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True  # an unfused fallback would hide the kernel's errors
    records = check(args)
    failed = [r for r in records if r["error"] > r["bound"]]
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "records": records}, indent=2), encoding="utf-8")
    if failed:
        print(
            f"check_engines: {len(failed)} of {len(records)} errors past their bound on {args.device}:", file=sys.stderr
        )
        for r in failed:
            print(f"  {r['rope_type']} {r['dtype']} {r['case']}: {r['error']:.2e} > {r['bound']:.1e}", file=sys.stderr)
        return 1
    print(f"check_engines: all {len(records)} errors within their bounds on {args.device}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
