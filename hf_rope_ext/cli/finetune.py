"""``hf-rope-ext finetune``: long-context LoRA fine-tuning of a causal LM at a target length and rope type.

Runs as a plain command on one device, or under ``accelerate launch --config_file examples/accelerate/<x>.yaml``
(``python -m hf_rope_ext finetune ...``) on many.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import (
    add_rope_arguments,
    comma_list,
    length,
    model_argument,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    progress_argument,
)
from .errors import out_of_memory


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless there is none (None / off) or the help states it."""

    def _get_help_string(self, action):
        unset = action.default is None or action.default is False or action.default in ([], argparse.SUPPRESS)
        if unset or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_parser(subparsers, name):
    p = subparsers.add_parser(
        name,
        help="fine-tune a long-context LoRA adapter (peft + accelerate + datasets)",
        description="Fine-tune a LoRA adapter at a target length and rope type; writes adapter, extended config, "
        "tokenizer, evaluation and card to --out (see docs/finetune.md).",
        formatter_class=HelpFormatter,
    )
    what = p.add_argument_group("what to train")
    model_argument(what, hub=True)
    what.add_argument("--out", required=True, help="new output folder (must not exist, unless resuming into it)")
    add_rope_arguments(
        what, factor_help="scaling factor s (>= 1; default: --length / the model's length)", rope_type_required=True
    )
    what.add_argument("--length", type=length, required=True, help="target context length in tokens")
    what.add_argument("--max-steps", type=positive_int, help="optimizer steps (required unless --stages gives them)")
    what.add_argument("--stages", help="progressive schedule 'length:steps,length:steps' (replaces --max-steps)")
    data = p.add_argument_group("data")
    data.add_argument("--data", nargs="+", help="text files/folders, or one Hub dataset name (default: bundled corpus)")
    data.add_argument("--eval-data", nargs="+", help="held-out text for perplexity (default: bundled eval split)")
    data.add_argument("--text-column", default="text", help="column of a Hub dataset that holds the text")
    data.add_argument("--packing", choices=("pack", "chunk"), default="pack", help="pack: concatenate documents")
    data.add_argument(
        "--position-schedule",
        choices=("contiguous", "pose", "random"),
        default="contiguous",
        help="position ids of a training sequence (pose/random: short windows whose positions span --length)",
    )
    data.add_argument(
        "--window", type=positive_int, help="tokens per sequence for pose/random (default: the original length)"
    )
    data.add_argument("--pose-chunks", type=positive_int, default=2, help="chunks per PoSE window")
    lora = p.add_argument_group("LoRA")
    lora.add_argument("--rank", type=positive_int, default=8, help="LoRA rank r")
    lora.add_argument("--alpha", type=positive_float, default=16.0, help="LoRA alpha (scale alpha / r)")
    lora.add_argument("--dropout", type=probability, default=0.0, help="LoRA dropout")
    lora.add_argument("--target-modules", default="q_proj,k_proj,v_proj,o_proj", help="comma-separated linear layers")
    lora.add_argument("--train-embeddings", action="store_true", help="also train the input embeddings (LongLoRA)")
    lora.add_argument("--train-norms", action="store_true", help="also train every norm layer (LongLoRA)")
    opt = p.add_argument_group("optimization")
    opt.add_argument("--lr", type=positive_float, default=2e-4, help="peak learning rate (AdamW)")
    opt.add_argument("--warmup-steps", type=non_negative_int, default=0, help="linear warm-up steps")
    opt.add_argument("--scheduler", default="cosine", help="transformers.get_scheduler name (linear, constant...)")
    opt.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="AdamW weight decay")
    opt.add_argument("--batch-size", type=positive_int, default=1, help="sequences per device per micro-batch")
    opt.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    opt.add_argument("--grad-checkpointing", action="store_true", help="recompute activations (less memory)")
    opt.add_argument(
        "--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto", help="auto: bf16 on a GPU, else fp32"
    )
    opt.add_argument("--seed", type=non_negative_int, default=0, help="seed of data order, LoRA init and positions")
    run = p.add_argument_group("checkpoints, outputs, evaluation")
    run.add_argument(
        "--save-every", type=non_negative_int, default=0, help="checkpoint every N steps, 0: only at the end"
    )
    run.add_argument("--resume-from", help="a checkpoint folder OUT/checkpoints/step-NNNNNN")
    run.add_argument("--merge", action="store_true", help="also write OUT/merged: the full model, rope parameters kept")
    run.add_argument("--log-dir", help="CSV (and TensorBoard) logs (default: OUT/logs)")
    run.add_argument(
        "--eval-lengths", type=comma_list(length), help="comma-separated lengths for perplexity before and after"
    )
    run.add_argument("--eval-rows", type=positive_int, default=4, help="documents per evaluation length")
    run.add_argument("--passkey-depths", type=non_negative_int, default=0, help="passkey needle depths per length")
    run.add_argument(
        "--eval-far-context",
        action="store_true",
        help="far-context loss at each eval length >= L0, against the base model reading a sliding L0 window "
        "(loads the base model once more)",
    )
    progress_argument(run)
    return p


def config_of(args):
    """The FinetuneConfig of the command line; a model folder is checked here (no Hub lookup for a path)."""
    from ..eval import loading
    from ..store.bundled import default_model_path
    from ..train import FinetuneConfig, parse_stages

    if args.max_steps is None and not args.stages:
        raise ValueError("--max-steps is required (or --stages 'length:steps,...', which gives the steps)")
    model = loading.resolve_model(args.model) if args.model else str(default_model_path())
    # refuses a model without RoPE, naming its model_type; a Hub id is read now, so a missing one fails in one line
    loading.load_config(model) if Path(model).is_dir() else loading.hub_config(model)
    return FinetuneConfig(
        model=model,
        out=args.out,
        rope_type=args.rope_type,
        length=args.length,
        max_steps=args.max_steps,
        factor=args.factor,
        rope_extra=loading.parse_rope_params(args.rope_param),
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
        eval_lengths=args.eval_lengths,
        eval_rows=args.eval_rows,
        passkey_depths=args.passkey_depths,
        eval_far_context=args.eval_far_context,
    )


def run(args) -> int:
    try:
        from ..train import finetune

        result = finetune(config_of(args))
    except KeyboardInterrupt:
        return interrupted(args.out)
    except Exception as err:
        if out_of_memory(err):
            resumable(args.out)
        raise
    if not is_main():
        return 0
    for record in result["results"]:
        passkey = f"  passkey {record['passkey_accuracy']:.2f}" if "passkey_accuracy" in record else ""
        far = f"  far-context ratio {record['far_context_ratio']:.4f}" if "far_context_ratio" in record else ""
        print(f"{record['when']:>6}  length {record['length']:>6}  perplexity {record['perplexity']:.4f}{passkey}{far}")
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

    from ..train.checkpoints import latest_checkpoint

    found = latest_checkpoint(Path(out) / "checkpoints")
    message = "interrupted before the first checkpoint; nothing to resume" if found is None else resume_note(found)
    if is_main():
        print(f"hf-rope-ext finetune: {message}", file=sys.stderr)
    return INTERRUPTED


def resumable(out: str) -> None:
    """After a failure: the checkpoint the run reached (kept in ``--out``) and the command that resumes from it."""
    import sys

    from ..train.checkpoints import latest_checkpoint

    found = latest_checkpoint(Path(out) / "checkpoints")
    if found is not None and is_main():
        print(f"hf-rope-ext finetune: {resume_note(found, 'stopped')}", file=sys.stderr)


def resume_note(checkpoint, what: str = "interrupted") -> str:
    return f"{what}; checkpoint {checkpoint}\nresume with:\n  {resume_command(checkpoint)}"


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
