"""The ``hf-rope-ext`` command: one module per subcommand, each with ``add_parser(subparsers)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
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
}


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
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"hf-rope-ext {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
