"""Time of one attention call forward and backward, as a LoRA step under PoSE runs it, for each attention-level rope
type: the fast engine (what ``sdpa`` runs) against the reference engine (dense scores per band).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_train_attention.py --lengths 1024 2048

Shapes of SmolLM2-135M (9 query heads, 3 kv heads, head_dim 64, trained at 8192), batch 1, float32, gradients on
q, k and v. Positions are PoSE's: the window's first half at 0.., the second half from ``--jump`` on (skip-wise,
rising), no mask, as ``finetune --position-schedule pose --pose-chunks 2`` passes them. Each training-free type
gets the parameters ``extend`` gives it at 4x (xPos and RoPER, which need training from scratch, are left out).
The table gives the median of ``--repeats`` calls per engine (the machine may be shared: the two engines
alternate) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import fast
from hf_rope_ext.eval import compare
from hf_rope_ext.types import registry

HEADS, KV_HEADS, HEAD_DIM, PRETRAIN = 9, 3, 64, 8192


def attention_module(rope_type: str):
    """The attention module of a one-layer Llama whose config names ``rope_type`` with extend's 4x parameters."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=PRETRAIN,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    )
    config.rope_parameters = compare.run_parameters(config, rope_type, 4.0, PRETRAIN)
    config.validate_rope()
    return LlamaForCausalLM(config).model.layers[0].self_attn


def step_seconds(module, length: int, jump: int, engine: str) -> float:
    """Seconds of one forward and backward through the ``sdpa`` attention function with ``engine``'s path."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, length, HEAD_DIM, generator=gen).requires_grad_()
    k, v = (torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=gen).requires_grad_() for _ in range(2))
    half = length // 2
    pos = torch.cat((torch.arange(half), torch.arange(jump, jump + length - half)))[None]  # [1, length], rising
    run = fast.run
    fast.run = run if engine == "fast" else (lambda *args, **kwargs: None)  # None: the reference engine runs
    try:
        start = time.perf_counter()
        out = function.attend("sdpa", module, q, k, v, None, position_ids=pos)[0]
        out.square().sum().backward()
        return time.perf_counter() - start
    finally:
        fast.run = run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="PoSE window lengths")
    parser.add_argument("--jump", type=int, default=20000, help="position of the window's second half")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    types = [m.name for m in registry.methods() if m.kind == "attention" and m.training_free]  # extend's methods
    print("| type | window | fast s | reference s | reference / fast |\n|---|---:|---:|---:|---:|")
    for rope_type in types:
        module = attention_module(rope_type)
        for length in args.lengths:
            times = {"fast": [], "reference": []}
            for _ in range(args.repeats):
                for engine in times:
                    times[engine].append(step_seconds(module, length, args.jump, engine))
            fast_s, ref_s = (statistics.median(times[e]) for e in ("fast", "reference"))
            print(f"| {rope_type} | {length} | {fast_s:.3f} | {ref_s:.3f} | {ref_s / fast_s:.1f} |")


if __name__ == "__main__":
    main()
