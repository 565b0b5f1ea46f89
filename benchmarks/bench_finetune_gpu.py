"""Reach and speed of long-context LoRA fine-tuning on one GPU: the longest sequence a step fits, and tokens/s, model
FLOPs utilisation (MFU) and peak memory at chosen lengths.

    python benchmarks/bench_finetune_gpu.py                                   # 1B and 7B shapes, 8k and 32k, reach
    python benchmarks/bench_finetune_gpu.py --shapes 7b --kernels liger --lengths 32768 --reach --json out.json

Random-weight Llamas of two real shapes (a Llama-3.2-1B-like and a Llama-2-7B-like model; configs only, no
download), base in bf16, LoRA (rank 16 on q/k/v/o, fp32 adapter weights) under bf16 autocast, the rope extended with
``--rope-type`` (yarn by default) to the longest length asked, SDPA attention (flash-attention 2 when installed and
the type works on frequencies), non-reentrant gradient checkpointing (``--no-checkpointing`` to turn it off), AdamW
on the adapter, one sequence per step. The loss never materializes the (tokens, vocab) logits:

- ``plain``: :func:`hf_rope_ext.train.loss.chunked_causal_lm_loss` (fp32 logits 4096 tokens at a time, recomputed in
  the backward pass);
- ``liger``: liger-kernel's fused RoPE, RMSNorm and SwiGLU patched into transformers' Llama, and its fused linear
  cross-entropy (``pip install liger-kernel``; reported as not installed otherwise).

Per length: one warm-up step, then ``--steps`` timed steps (forward, loss, backward, optimizer step); peak memory is
``torch.cuda.max_memory_allocated`` over the timed steps. ``--reach`` doubles the length from ``--reach-start`` until a
step runs out of memory, then bisects down to ``--reach-step`` tokens; the longest length that fits is timed as above.

MFU counts LoRA's model FLOPs per token: ``4 N + 6 L s d`` (N: weights of the matrix products incl. the output head,
forward 2N plus input gradients 2N, no weight gradients for the frozen base; attention over a causal prefix,
``2 s d`` per layer forward and twice that backward, d = heads x head dim, s = length, L = layers; recomputation by
checkpointing not counted), divided by the GPU's dense bf16 peak (``--peak-tflops``, else by its name: H100 SXM and
H200 989, H100 PCIe 756, A100 312). Without a CUDA device the script prints what it would measure and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import time
from functools import partial

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
KERNELS = ("plain", "liger")
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))  # dense bf16, first match
CHUNK = 4096  # tokens per chunk of the plain loss


def matmul_params(config) -> int:
    """Weights of a Llama's matrix products: per layer q, k, v, o and the gated MLP, plus the output head."""
    d, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    attention = d * heads * head_dim * 2 + d * kv * head_dim * 2  # q and o, k and v
    mlp = 3 * d * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp) + d * config.vocab_size


def lora_flops_per_token(config, length: int) -> float:
    """LoRA training FLOPs per token (see the module docstring): 4 N + 6 L s (heads x head_dim)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 6 * config.num_hidden_layers * length * config.num_attention_heads * head_dim
    return 4 * matmul_params(config) + attention


def peak_flops(name: str, override: float | None) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``name`` (None when unknown and not given)."""
    if override:
        return override * 1e12
    return next((tflops * 1e12 for key, tflops in PEAK_TFLOPS if key in name), None)


def llama_config(shape: str, rope_type: str, length: int):
    """The shape's config with the rope extended to ``length`` tokens by ``rope_type``."""
    from transformers import LlamaConfig

    from hf_rope_ext.train.model import target_rope_parameters

    config = LlamaConfig(**SHAPES[shape])
    rope, max_positions = target_rope_parameters(config, rope_type, max(length, config.max_position_embeddings))
    config.rope_parameters, config.max_position_embeddings = rope, max_positions
    return config


def build(shape: str, kernels: str, rope_type: str, length: int, checkpointing: bool):
    """The random bf16 model on the GPU, LoRA-wrapped, ready to train at up to ``length`` tokens."""
    from transformers import LlamaForCausalLM

    from hf_rope_ext.train.lora import apply_lora
    from hf_rope_ext.train.model import attention_implementation

    if kernels == "liger":  # patches transformers' Llama classes: before the model is built
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False)
    config = llama_config(shape, rope_type, length)
    config._attn_implementation = attention_implementation(rope_type, torch.device("cuda"))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model = apply_lora(model, rank=16, alpha=32.0)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.train()


def loss_function(kernels: str):
    """(model, input_ids (1, seq)) -> mean next-token loss from the last hidden states, never the full logits."""
    from hf_rope_ext.train.loss import chunked_causal_lm_loss

    fused = None
    if kernels == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        fused = LigerFusedLinearCrossEntropyLoss()

    def loss(model, input_ids: torch.Tensor) -> torch.Tensor:
        base = model.get_base_model()
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        hidden = base.model(input_ids=input_ids, position_ids=positions).last_hidden_state  # (1, seq, dim)
        weight = base.get_output_embeddings().weight  # (vocab, dim)
        if fused is None:
            return chunked_causal_lm_loss(hidden, weight, input_ids, CHUNK)
        return fused(weight, hidden[0, :-1], input_ids[0, 1:])

    return loss


def train_step(model, optimizer, loss, input_ids: torch.Tensor) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        value = loss(model, input_ids)
    value.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(model, optimizer, loss, length: int, steps: int) -> dict:
    """``steps`` timed steps at ``length`` tokens, right after a step that fitted there (the warm-up: kernels,
    allocator, optimizer state): seconds per step and peak GiB."""
    ids = torch.randint(0, model.config.vocab_size, (1, length), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, loss, ids)
    torch.cuda.synchronize()
    return {"step_s": (time.perf_counter() - start) / steps, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def fits(model, optimizer, loss, length: int) -> bool:
    """Whether one training step at ``length`` tokens runs without running out of GPU memory."""
    try:
        train_step(model, optimizer, loss, torch.randint(0, model.config.vocab_size, (1, length), device="cuda"))
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()


def reach(fits_at, start: int, limit: int, step: int) -> int | None:
    """The longest multiple of ``step`` in [step, limit] for which ``fits_at(length)`` holds, assuming it holds up to
    some length and not beyond: lengths doubled from ``start`` until one fails, then bisection. None if none fits."""
    low, high, length = None, None, start
    while length <= limit and high is None:
        low, high = (length, None) if fits_at(length) else (low, length)
        length *= 2
    if high is None:
        return low
    low = low or 0
    while high - low > step:
        middle = (low + high) // 2 // step * step
        low, high = (middle, high) if fits_at(middle) else (low, middle)
    return low or None


def record(shape: str, kernels: str, length: int, timing: dict, config, peak: float | None, note: str = "") -> dict:
    flops = lora_flops_per_token(config, length) * length / timing["step_s"]
    return {
        "shape": shape,
        "kernels": kernels,
        "length": length,
        "tokens_per_s": round(length / timing["step_s"], 1),
        "step_s": round(timing["step_s"], 3),
        "tflops": round(flops / 1e12, 1),
        "mfu": round(flops / peak, 3) if peak else None,
        "peak_gib": round(timing["peak_gib"], 2),
        "note": note,
    }


def run_configuration(shape: str, kernels: str, args, peak: float | None) -> list[dict]:
    """Every measurement of one (shape, kernels): the asked lengths, then the reach."""
    top = max([*args.lengths, args.reach_max if args.reach else 0])
    model = build(shape, kernels, args.rope_type, top, not args.no_checkpointing)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    loss, records = loss_function(kernels), []
    lengths = [(n, "") for n in args.lengths]
    if args.reach:
        longest = reach(partial(fits, model, optimizer, loss), args.reach_start, args.reach_max, args.reach_step)
        lengths.append((longest or 0, "reach"))
    for length, note in lengths:
        if length and fits(model, optimizer, loss, length):  # also the warm-up of the timed steps
            timing = timed(model, optimizer, loss, length, args.steps)
            records.append(record(shape, kernels, length, timing, model.config, peak, note))
        else:
            records.append(oom(shape, kernels, length, note))
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return records


def oom(shape: str, kernels: str, length: int, note: str = "") -> dict:
    return {"shape": shape, "kernels": kernels, "length": length, "tokens_per_s": "OOM", "note": note}


def plan(args) -> list[str]:
    """What the run measures, one line per (shape, kernels)."""
    lines = []
    for shape in args.shapes:
        for kernels in args.kernels:
            what = f"lengths {args.lengths}" + (
                f", reach from {args.reach_start} up to {args.reach_max} (step {args.reach_step})" if args.reach else ""
            )
            lines.append(
                f"{shape} {kernels}: {what}; tokens/s, MFU, peak GiB; {args.rope_type} rope, "
                f"{'no ' if args.no_checkpointing else ''}gradient checkpointing, LoRA r16 q/k/v/o, bf16"
            )
    return lines


COLUMNS = ("shape", "kernels", "length", "tokens_per_s", "step_s", "tflops", "mfu", "peak_gib", "note")


def table(records: list[dict]) -> str:
    head = "| shape | kernels | length | tokens/s | s/step | TFLOP/s | MFU | peak GiB | note |\n" + "| --- " * 9 + "|"
    return "\n".join([head, *("| " + " | ".join(cell(r, k) for k in COLUMNS) + " |" for r in records)])


def cell(record: dict, key: str) -> str:
    value = record.get(key)
    if value is None:
        return ""
    return f"{100 * value:.1f}%" if key == "mfu" else str(value)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--lengths", nargs="*", type=int, default=[8192, 32768], help="lengths to time")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per length (after one warm-up)")
    parser.add_argument("--reach", action="store_true", help="also find and time the longest length that fits")
    parser.add_argument("--reach-start", type=int, default=16384)
    parser.add_argument("--reach-max", type=int, default=524288)
    parser.add_argument("--reach-step", type=int, default=8192, help="resolution of the reach search in tokens")
    parser.add_argument("--rope-type", default="yarn", help="rope type extending the shape (see hf-rope-ext list)")
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every activation (no recomputation)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak (default: by its name)")
    parser.add_argument("--json", help="also write the records to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("bench_finetune_gpu: skipped, no CUDA device. It would measure:")
        print("\n".join(f"  {line}" for line in plan(args)))
        return 0
    name = torch.cuda.get_device_name()
    peak, records = peak_flops(name, args.peak_tflops), []
    print(f"device: {name}, torch {torch.__version__}, peak {peak and peak / 1e12} TFLOP/s")
    for kernels in sorted(args.kernels, key=KERNELS.index):  # liger patches transformers for good: it comes last
        for shape in args.shapes:
            if kernels == "liger" and importlib.util.find_spec("liger_kernel") is None:
                records.append({"shape": shape, "kernels": kernels, "note": "liger-kernel not installed"})
                continue
            new = run_configuration(shape, kernels, args, peak)
            print("\n".join(table(new).splitlines()[2:]), flush=True)
            records += new
    print(table(records))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"device": name, "torch": torch.__version__, "records": records}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
