"""Fine-tune a long-context LoRA adapter with hf-rope-ext's Python API.

Defaults: the bundled tiny Llama (pretrained at 512 tokens) extended 4x to 2048 with ``ntk_by_parts`` frequencies,
PoSE positions (512-token windows whose positions span 2048), trainable norms, perplexity and passkey before/after.

    python examples/finetune_long_lora.py --out runs/tiny-2k                       # one process (CPU or one GPU)
    accelerate launch --config_file examples/accelerate/ddp.yaml examples/finetune_long_lora.py \
        --model meta-llama/Llama-3.2-1B --length 32768 --rope-type yarn --schedule contiguous --out runs/1b-32k

The same job from the shell: ``hf-rope-ext finetune --model ... --out ...`` (see ``hf-rope-ext finetune --help``).
"""

from __future__ import annotations

import argparse

import hf_rope_ext  # noqa: F401  (registers the rope types into transformers)
from hf_rope_ext.train import FinetuneConfig, finetune


def parse_args(argv=None):
    from hf_rope_ext.store.bundled import default_model_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="base model folder or Hub id (default: the bundled tiny Llama)")
    p.add_argument("--out", required=True, help="new output folder")
    p.add_argument("--rope-type", default="ntk_by_parts")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--schedule", choices=("contiguous", "pose", "random"), default="pose")
    p.add_argument("--window", type=int, default=None, help="pose/random window (default: the model's length)")
    p.add_argument("--max-steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--data", nargs="+", default=None, help="text files or folders (default: bundled corpus)")
    p.add_argument("--merge", action="store_true")
    args = p.parse_args(argv)
    args.model = args.model or str(default_model_path())
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    config = FinetuneConfig(
        model=args.model,
        out=args.out,
        rope_type=args.rope_type,
        length=args.length,
        max_steps=args.max_steps,
        data=args.data,
        position_schedule=args.schedule,
        window=args.window if args.schedule != "contiguous" else None,
        rank=16,
        alpha=32.0,
        train_norms=True,  # LongLoRA: trainable norms (and --train-embeddings on the CLI) help LoRA extend context
        lr=args.lr,
        warmup_steps=min(10, args.max_steps // 10),
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        grad_checkpointing=args.grad_checkpointing,
        save_every=max(1, args.max_steps // 2),
        merge=args.merge,
        eval_lengths=[args.length],
        eval_rows=8,
        passkey_depths=5,
    )
    result = finetune(config)
    for record in result["results"]:
        print(
            f"{record['when']:>6} @ {record['length']}: perplexity {record['perplexity']:.3f}, "
            f"passkey {record.get('passkey_accuracy', float('nan')):.2f}"
        )
    print("adapter written to", result["out"])


if __name__ == "__main__":
    main()
