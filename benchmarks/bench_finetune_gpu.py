"""Tokens/s and peak GPU memory of long-context LoRA fine-tuning steps, with and without gradient checkpointing.

    python benchmarks/bench_finetune_gpu.py                                  # 1B and 7B shapes at 8k, 16k, 32k
    python benchmarks/bench_finetune_gpu.py --shapes 1b --lengths 8192 --steps 5 --json bench_finetune.json

Random-weight Llamas of two real shapes (a Llama-3.2-1B-like and a Llama-2-7B-like model), base in bf16, LoRA
(rank 16 on q/k/v/o, fp32 adapter weights) under bf16 autocast, yarn rope parameters extending the shape's
pretraining length to the measured length, SDPA attention, AdamW on the adapter, batch of one sequence. Per
configuration: one warm-up step, then ``--steps`` timed steps (forward, fp32 next-token loss over the full vocabulary,
backward, optimizer step); peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps. A configuration
that runs out of memory is reported as OOM. Without a CUDA device the script prints that it skipped and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

import hf_rope_ext  # noqa: F401  (registers the rope types)

SHAPES = {
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    ),
    "7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def build(shape: str, length: int, checkpointing: bool):
    """The random bf16 model of ``shape`` on the GPU, rope extended to ``length`` (yarn), wrapped in LoRA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_rope_ext.train.lora import apply_lora
    from hf_rope_ext.train.model import target_rope_parameters

    config = LlamaConfig(**SHAPES[shape])
    rope, max_positions = target_rope_parameters(config, "yarn", max(length, config.max_position_embeddings))
    config.rope_parameters, config.max_position_embeddings = rope, max_positions
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model = apply_lora(model, rank=16, alpha=32.0)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.train()


def train_step(model, optimizer, input_ids: torch.Tensor) -> None:
    from hf_rope_ext.train.loop import causal_lm_loss

    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=input_ids, position_ids=positions, attention_mask=torch.ones_like(input_ids)).logits
    causal_lm_loss(logits, input_ids).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(shape: str, length: int, checkpointing: bool, steps: int) -> dict:
    """One configuration: tokens/s over ``steps`` timed steps and the peak memory in GiB (or 'OOM')."""
    record = {"shape": shape, "length": length, "grad_checkpointing": checkpointing}
    model = optimizer = None
    try:
        model = build(shape, length, checkpointing)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, model.config.vocab_size, (1, length), device="cuda")
        train_step(model, optimizer, ids)  # warm-up: kernels, allocator, optimizer state
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(steps):
            train_step(model, optimizer, ids)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / steps
        record |= {
            "tokens_per_s": round(length / seconds, 1),
            "step_s": round(seconds, 3),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }
    except torch.cuda.OutOfMemoryError:
        record |= {"tokens_per_s": "OOM", "step_s": "OOM", "peak_gib": "OOM"}
    finally:
        del model, optimizer
        gc.collect()
        torch.cuda.empty_cache()
    return record


def table(records: list[dict]) -> str:
    head = (
        "| shape | length | grad checkpointing | tokens/s | s/step | peak GiB |\n| --- | --- | --- | --- | --- | --- |"
    )
    rows = [
        f"| {r['shape']} | {r['length']} | {'yes' if r['grad_checkpointing'] else 'no'} | {r['tokens_per_s']} | "
        f"{r['step_s']} | {r['peak_gib']} |"
        for r in records
    ]
    return "\n".join([head, *rows])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--lengths", nargs="+", type=int, default=[8192, 16384, 32768])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", help="also write the records to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_finetune_gpu: skipped, no CUDA device (this benchmark measures GPU memory and throughput)")
        return 0
    from tqdm.auto import tqdm

    grid = [(s, n, c) for s in args.shapes for n in args.lengths for c in (True, False)]
    records = [measure(s, n, c, args.steps) for s, n, c in tqdm(grid, desc="configurations")]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print(table(records))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(records, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
