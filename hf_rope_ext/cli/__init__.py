"""The ``hf-rope-ext`` command: one module per subcommand, each with ``add_parser(subparsers)`` and ``run(args)``.

The subcommand modules import nothing heavy at import time, and the package registers itself into transformers only
once a subcommand that needs it runs (see ``hf_rope_ext.load``): ``--help`` and ``list`` do not import transformers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand name -> module under hf_rope_ext.cli (modules import heavy libraries inside run(), not at import)
COMMANDS = {
    "list": "list_types",
    "eval": "eval_cmd",
    "extend": "extend",
    "convert-layout": "convert_layout",
    "finetune": "finetune",
    "export": "export",
    "push": "push",
    "get-smollm2": "get_smollm2",
    "gguf": "gguf",
}
NO_TRANSFORMERS = ("list",)  # subcommands that run without registering into transformers
# Errors of bad input or of the file system: one line on stderr, exit status 2; anything else is a bug (traceback).
USER_ERRORS = (ValueError, KeyError, OSError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-rope-ext",
        description="RoPE context extension for Hugging Face transformers: rope types, layouts, LoRA, evaluation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        sub_parser = module.add_parser(sub, name)
        sub_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command handles it (while the libraries load): no traceback
        print("hf-rope-ext: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0), or a usage error argparse has printed with the usage (2)
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    quiet_progress(args)
    try:
        if args.command not in NO_TRANSFORMERS:
            load_package(args)
        return int(args._run(args) or 0)
    except BrokenPipeError:  # `hf-rope-ext list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except USER_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"hf-rope-ext {args.command}: error: {message}", file=sys.stderr)
        return 2


def quiet_progress(args) -> None:
    """``--no-progress``, or a stderr that is not a terminal (a log file, a pipe): no progress bars at all, neither
    this package's nor transformers' ("Loading weights") nor huggingface_hub's / datasets'."""
    args._quiet = getattr(args, "no_progress", False) or not sys.stderr.isatty()
    if not args._quiet:
        return
    if hasattr(args, "no_progress"):
        args.no_progress = True
    if "transformers" not in sys.modules:  # the command's own process: these are read when the libraries load
        for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
            os.environ[name] = "1"


def load_package(args) -> None:
    """Register the package into transformers; silence transformers' own bars when the command is quiet."""
    import hf_rope_ext

    hf_rope_ext.load()
    if args._quiet:
        from transformers.utils import logging

        logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
