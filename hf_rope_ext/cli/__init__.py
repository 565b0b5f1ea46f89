"""The ``hf-rope-ext`` command: one module per subcommand, each with ``add_parser(subparsers)`` and ``run(args)``.

The subcommand modules import nothing heavy at import time, and the package registers itself into transformers only
once a subcommand that needs it runs (see ``hf_rope_ext.load``): ``--help`` and ``list`` do not import transformers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from ..util import progress
from ..util.did_you_mean import did_you_mean
from .errors import out_of_memory, out_of_memory_message

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
    "plan": "plan",
}
NO_TRANSFORMERS = ("list", "plan")  # subcommands that run without registering into transformers
# library -> (environment variable read at its import, its function that turns its bars off later)
LIBRARY_BARS = {
    "huggingface_hub": ("HF_HUB_DISABLE_PROGRESS_BARS", "huggingface_hub.utils.disable_progress_bars"),
    "datasets": ("HF_DATASETS_DISABLE_PROGRESS_BARS", "datasets.utils.logging.disable_progress_bar"),
}
# Errors of bad input or of the file system: one line on stderr, exit status 2; anything else is a bug (traceback).
USER_ERRORS = (ValueError, KeyError, OSError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-rope-ext",
        description="RoPE context extension for Hugging Face transformers: rope types, layouts, LoRA, evaluation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = {}  # name -> the subcommand's parser, for its own usage line on a misspelled flag
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        parser.commands[name] = module.add_parser(sub, name)
        parser.commands[name].set_defaults(_run=module.run)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, except that an argument the subcommand does not know is refused by the subcommand's
    parser (its usage, not the top-level one), naming the argument and the closest flag it has."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = parser.commands[args.command]
        flags = [flag for action in command._actions for flag in action.option_strings if flag.startswith("--")]
        first = next((item.split("=", 1)[0] for item in unknown if item.startswith("-")), "")
        command.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(first, flags) if first else ''}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command handles it (while the libraries load): no traceback
        print("hf-rope-ext: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    try:
        args = parse(build_parser(), argv)
        args._command = shlex.join(["hf-rope-ext", *(sys.argv[1:] if argv is None else argv)])  # for reports
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
    except Exception as err:
        if not out_of_memory(err):
            raise  # a bug: the traceback is what a report needs
        print(f"hf-rope-ext {args.command}: error: {out_of_memory_message(args.command, err)}", file=sys.stderr)
        return 1


def quiet_progress(args) -> None:
    """The one progress switch (``hf_rope_ext.util.progress``): nothing with ``--no-progress``, bars on a terminal,
    plain periodic lines when stderr is a file or a pipe. Other libraries' bars (huggingface_hub's, datasets') show only
    as bars on a terminal; transformers' "Loading weights" never (a command loads many models; its own loops report)."""
    args._quiet = progress.configure(enabled=not getattr(args, "no_progress", False)) != "bars"
    if not args._quiet:
        return
    os.environ["TQDM_DISABLE"] = "1"
    for module, (variable, switch) in LIBRARY_BARS.items():
        if module in sys.modules:  # already loaded (the command called from Python): its own switch
            getattr(importlib.import_module(switch.rsplit(".", 1)[0]), switch.rsplit(".", 1)[1])()
        else:  # read when the library loads
            os.environ[variable] = "1"


def load_package(args) -> None:
    """Register the package into transformers; silence transformers' own bars (see ``quiet_progress``)."""
    import hf_rope_ext

    hf_rope_ext.load()
    from transformers.utils import logging

    logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
