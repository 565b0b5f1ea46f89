"""``hf-rope-ext finetune``: long-context LoRA fine-tuning of a causal LM at a target length and rope type.

Runs as a plain command on one device, or under ``accelerate launch --config_file examples/accelerate/<x>.yaml``
(``python -m hf_rope_ext finetune ...``) on many.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from ..store.bundled import default_model_path
from ..train.config import GROUPS, FinetuneConfig, parse_stages
from ..train.run_folder import newest_checkpoint
from .args import (
    add_rope_arguments,
    comma_list,
    length,
    model_argument,
    names,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    progress_argument,
)
from .errors import out_of_memory

# the checkers a field's metadata names as its ``type`` (see hf_rope_ext.train.config.option)
TYPES = {
    "length": length,
    "lengths": comma_list(length),
    "names": names,
    "non_negative_float": non_negative_float,
    "non_negative_int": non_negative_int,
    "positive_float": positive_float,
    "positive_int": positive_int,
    "probability": probability,
}
FIELDS = {f.name: f for f in fields(FinetuneConfig)}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless there is none (None / off) or the help states it."""

    def _get_help_string(self, action):
        unset = action.default is None or action.default is False or action.default in ([], argparse.SUPPRESS)
        if unset or "default" in (action.help or ""):
            return action.help
        if isinstance(action.default, tuple):  # a comma-separated list on the command line
            return f"{action.help} (default: {','.join(action.default)})"
        return super()._get_help_string(action)


def add_parser(subparsers, name):
    p = subparsers.add_parser(
        name,
        help="fine-tune a long-context LoRA adapter (peft + accelerate + datasets)",
        description="Fine-tune a LoRA adapter at a target length and rope type; writes adapter, extended config, "
        "tokenizer, evaluation and card to --out (see docs/finetune.md).",
        formatter_class=HelpFormatter,
    )
    add_options(p)
    return p


def add_options(parser) -> None:
    """FinetuneConfig's fields as flags, each group in the order of the fields; a helper that other subcommands
    share adds its flags once, where its first field stands."""
    done = set()
    for title in GROUPS:
        group = parser.add_argument_group(title)
        for field in (f for f in FIELDS.values() if f.metadata["group"] == title):
            shared = field.metadata.get("shared")
            if shared is None:
                add_option(group, field)
            elif shared not in done:
                add_shared(group, shared)
                done.add(shared)
    progress_argument(group)  # the last group's: checkpoints, outputs, evaluation


def flag_of(field) -> str:
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


def dest_of(field) -> str:
    """The attribute of the parsed arguments that holds the field's flag."""
    return flag_of(field)[2:].replace("-", "_")


def add_option(group, field) -> None:
    """The flag of one field: its default the field's (none: required; False: a switch), the rest its metadata."""
    settings = {
        key: field.metadata[key] for key in ("help", "choices", "nargs", "const", "metavar") if key in field.metadata
    }
    if "type" in field.metadata:
        settings["type"] = TYPES[field.metadata["type"]]
    default = field.default if field.default_factory is MISSING else field.default_factory()
    if default is MISSING:
        settings["required"] = True
    elif default is False:
        settings["action"] = "store_true"
    else:
        settings["default"] = default
    group.add_argument(flag_of(field), **settings)


def add_shared(group, shared: str) -> None:
    """The flags that other subcommands share (``--model``; ``--rope-type``, ``--factor``, ``--rope-param``)."""
    if shared == "model":
        model_argument(group, hub=True)
    if shared == "rope":
        add_rope_arguments(group, factor_help=FIELDS["factor"].metadata["help"], rope_type_required=True)


def config_of(args):
    """The FinetuneConfig of the command line, each field from its flag; a model folder is checked here (no Hub
    lookup for a path)."""
    from ..eval import loading  # torch: loaded when the command runs

    if args.max_steps is None and not args.stages:
        raise ValueError("--max-steps is required (or --stages 'length:steps,...', which gives the steps)")
    model = loading.resolve_model(args.model) if args.model else str(default_model_path())
    # refuses a model without RoPE, naming its model_type; a Hub id is read now, so a missing one fails in one line
    loading.load_config(model) if Path(model).is_dir() else loading.hub_config(model)
    given = {name: getattr(args, dest_of(field)) for name, field in FIELDS.items()}
    # the options whose text the command reads after argparse: the model, KEY=VALUE pairs, 'length:steps,...'
    read = {
        "model": model,
        "rope_extra": loading.parse_rope_params(args.rope_param),
        "stages": parse_stages(args.stages),
    }
    return FinetuneConfig(**{**given, **read})


def run(args) -> int:
    try:
        from ..train.job import finetune  # torch: loaded when the command runs

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
    return os.environ.get("RANK", "0") == "0"


def interrupted(out: str) -> int:
    """Ctrl-C: one short message on stderr, and the command that resumes from the newest checkpoint of ``--out``."""
    found = newest_checkpoint(out)
    message = "interrupted before the first checkpoint; nothing to resume" if found is None else resume_note(found)
    if is_main():
        print(f"hf-rope-ext finetune: {message}", file=sys.stderr)
    return INTERRUPTED


def resumable(out: str) -> None:
    """After a failure: the checkpoint the run reached (kept in ``--out``) and the command that resumes from it."""
    found = newest_checkpoint(out)
    if found is not None and is_main():
        print(f"hf-rope-ext finetune: {resume_note(found, 'stopped')}", file=sys.stderr)


def resume_note(checkpoint, what: str = "interrupted") -> str:
    return f"{what}; checkpoint {checkpoint}\nresume with:\n  {resume_command(checkpoint)}"


def resume_command(checkpoint) -> str:
    """This process' finetune command line with ``--resume-from checkpoint`` (same --out: the run continues there)."""
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
