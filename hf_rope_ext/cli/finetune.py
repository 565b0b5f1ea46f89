"""``hf-rope-ext finetune``: long-context LoRA fine-tuning of a causal LM at a target length and rope type.

Runs as a plain command on one device, or under ``accelerate launch --config_file examples/accelerate/<x>.yaml``
(``python -m hf_rope_ext finetune ...``) on many.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_parser(subparsers, name):
    p = subparsers.add_parser(name, help="fine-tune a long-context LoRA adapter (peft + accelerate + datasets)")
    p.add_argument("--model", help="base model folder or Hub id (default: the bundled tiny-llama-stdlib)")
    p.add_argument("--out", required=True, help="new output folder (must not exist)")
    p.add_argument("--rope-type", required=True, help="rope_type: see `hf-rope-ext list`")
    p.add_argument("--length", type=int, required=True, help="target context length in tokens")
    p.add_argument("--factor", type=float, help="scaling factor (default: length / the model's length)")
    p.add_argument(
        "--rope-param", action="append", default=[], metavar="KEY=VALUE", help="extra rope parameter (JSON value)"
    )
    p.add_argument("--max-steps", type=int, help="optimizer steps (the sum of --stages steps when given)")
    p.add_argument("--stages", help="progressive schedule 'length:steps,length:steps'")
    p.add_argument("--data", nargs="+", help="text files/folders, or one Hub dataset name (default: bundled corpus)")
    p.add_argument("--eval-data", nargs="+", help="held-out text for perplexity (default: bundled eval split)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--packing", choices=("pack", "chunk"), default="pack")
    p.add_argument("--position-schedule", choices=("contiguous", "pose", "random"), default="contiguous")
    p.add_argument("--window", type=int, help="tokens per sequence for pose/random (default: the original length)")
    p.add_argument("--pose-chunks", type=int, default=2)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--target-modules", default="q_proj,k_proj,v_proj,o_proj", help="comma-separated linear layers")
    p.add_argument("--train-embeddings", action="store_true", help="also train the input embeddings (LongLoRA)")
    p.add_argument("--train-norms", action="store_true", help="also train every norm layer (LongLoRA)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument(
        "--scheduler", default="cosine", help="transformers.get_scheduler name (linear, cosine, constant...)"
    )
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=1, help="sequences per device per micro-batch")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto", help="auto: bf16 on GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (always at the end)")
    p.add_argument("--resume-from", help="a checkpoint folder OUT/checkpoints/step-NNNNNN")
    p.add_argument("--merge", action="store_true", help="also write OUT/merged: the full model, rope parameters kept")
    p.add_argument("--log-dir", help="CSV (and TensorBoard) logs (default OUT/logs)")
    p.add_argument("--eval-lengths", help="comma-separated lengths for perplexity before and after")
    p.add_argument("--eval-rows", type=int, default=4, help="documents per evaluation length")
    p.add_argument("--passkey-depths", type=int, default=0, help="passkey needle depths per length (0: none)")
    return p


def rope_extra(items: list[str]) -> dict:
    """['beta_fast=16', 'truncate=false'] -> {'beta_fast': 16, 'truncate': False}."""
    extra = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--rope-param {item!r}: expected KEY=VALUE")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"--rope-param {item!r}: the value is not JSON ({err.msg})") from None
    return extra


def config_of(args):
    from ..bundled import default_model_path
    from ..train import FinetuneConfig, parse_stages

    lengths = [int(x) for x in args.eval_lengths.split(",")] if args.eval_lengths else None
    return FinetuneConfig(
        model=args.model or str(default_model_path()),
        out=args.out,
        rope_type=args.rope_type,
        length=args.length,
        max_steps=args.max_steps,
        factor=args.factor,
        rope_extra=rope_extra(args.rope_param),
        data=args.data,
        eval_data=args.eval_data,
        text_column=args.text_column,
        packing=args.packing,
        stages=parse_stages(args.stages),
        position_schedule=args.position_schedule,
        window=args.window,
        pose_chunks=args.pose_chunks,
        rank=args.rank,
        alpha=args.alpha,
        dropout=args.dropout,
        target_modules=tuple(args.target_modules.split(",")),
        train_embeddings=args.train_embeddings,
        train_norms=args.train_norms,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        scheduler=args.scheduler,
        weight_decay=args.weight_decay,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        grad_checkpointing=args.grad_checkpointing,
        precision=args.precision,
        seed=args.seed,
        save_every=args.save_every,
        resume_from=args.resume_from,
        merge=args.merge,
        log_dir=args.log_dir,
        eval_lengths=lengths,
        eval_rows=args.eval_rows,
        passkey_depths=args.passkey_depths,
    )


def run(args) -> int:
    try:
        from ..train import finetune

        result = finetune(config_of(args))
    except KeyboardInterrupt:
        return interrupted(args.out)
    if not is_main():
        return 0
    for record in result["results"]:
        passkey = f"  passkey {record['passkey_accuracy']:.2f}" if "passkey_accuracy" in record else ""
        print(f"{record['when']:>6}  length {record['length']:>6}  perplexity {record['perplexity']:.4f}{passkey}")
    print(f"adapter: {result['out']}" + (f"\nmerged model: {result['merged']}" if result["merged"] else ""))
    return 0


INTERRUPTED = 130  # the shell's code for a command ended by SIGINT


def is_main() -> bool:
    """Rank 0 of a launch (or no launcher): the one process that prints the command's messages."""
    import os

    return os.environ.get("RANK", "0") == "0"


def interrupted(out: str) -> int:
    """Ctrl-C: one short message on stderr, and the command that resumes from the newest checkpoint of ``--out``."""
    import sys

    from ..train.loop import latest_checkpoint

    found = latest_checkpoint(Path(out) / "checkpoints")
    message = (
        "interrupted before the first checkpoint; nothing to resume"
        if found is None
        else f"interrupted; checkpoint {found}\nresume with:\n  {resume_command(found)}"
    )
    if is_main():
        print(f"hf-rope-ext finetune: {message}", file=sys.stderr)
    return INTERRUPTED


def resume_command(checkpoint) -> str:
    """This process' finetune command line with ``--resume-from checkpoint`` (same --out: the run continues there)."""
    import os
    import shlex
    import sys

    argv, kept = sys.argv[1:], []
    if "finetune" not in argv:  # called from Python, not from the command line
        return f"hf-rope-ext finetune <the same options> --resume-from {shlex.quote(str(checkpoint))}"
    skip = False
    for item in argv:
        name = item.split("=", 1)[0]  # argparse takes '--resume-from X', '--resume-from=X' and prefixes like --resume
        if skip or (name.startswith("--re") and "--resume-from".startswith(name)):
            skip = not skip and "=" not in item  # the value follows as its own word
            continue
        kept.append(item)
    tail = shlex.join([*kept, "--resume-from", str(checkpoint)])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"accelerate launch <the same launch options> -m hf_rope_ext {tail}"
    return ("hf-rope-ext " if Path(sys.argv[0]).name == "hf-rope-ext" else "python -m hf_rope_ext ") + tail
