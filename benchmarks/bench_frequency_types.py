"""Forward time of a small Llama with each frequency-level type, as a ratio to the same model with ``linear``.

Frequency-level types only change ``inv_freq``, so the ratio should be 1.0 within noise. Runs are interleaved
(every type once per round) so that drift of the machine hits every type alike; the median per type is reported.

    python benchmarks/bench_frequency_types.py [--length 1024] [--rounds 15] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_rope_ext
from hf_rope_ext.types import registry


def build(rope_parameters: dict, device: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=384,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=512,
        rope_parameters=rope_parameters,
    )
    return LlamaForCausalLM(config).to(device).eval()


def time_forward(model, ids) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model(ids)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    base = {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512}
    types = {"linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}
    for method in registry.methods():
        if method.kind == "frequency":
            params = {k: v for k, v in base.items() if k in method.params or k == "rope_theta"}
            types[method.name] = {"rope_type": method.name, **params}
    models = {name: build(params, args.device) for name, params in types.items()}
    ids = torch.randint(0, 384, (1, args.length), device=args.device)
    for model in models.values():
        time_forward(model, ids)  # warm-up
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append(time_forward(model, ids))
    reference = statistics.median(times["linear"])
    print(
        f"hf-rope-ext {hf_rope_ext.__version__}, torch {torch.__version__}, {args.device}, "
        f"{args.length} tokens, {args.rounds} rounds, median forward time"
    )
    print("| rope_type | median ms | ratio to linear |\n|---|---|---|")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"| `{name}` | {median * 1e3:.1f} | {median / reference:.3f} |")


if __name__ == "__main__":
    main()
