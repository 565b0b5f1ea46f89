"""``hf-rope-ext convert-layout SRC DST --to half|interleaved``: permute q/k rows of a saved model or adapter."""

from __future__ import annotations

import argparse

from .args import progress_argument


def add_parser(subparsers, name: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        name,
        help="convert a saved model or LoRA adapter between the interleaved and half-rotate RoPE layouts",
        description=(
            "Permute the query/key rows (weights, biases, lora_B) of a saved model directory (safetensors, "
            "sharded or not) or a peft adapter directory into another RoPE layout. SRC is never written. Only "
            "SRC's top-level files are written; its subfolders (a fine-tuning run's checkpoints/, merged/) are left "
            "out and named: convert a merged/ model with a second call."
        ),
    )
    parser.add_argument("src", metavar="SRC", help="model directory (config.json) or adapter directory")
    parser.add_argument("dst", metavar="DST", help="new directory to write")
    parser.add_argument("--to", required=True, choices=["half", "interleaved"], help="layout to convert to")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an existing DST, replacing only the files convert-layout writes",
    )
    parser.add_argument(
        "--config",
        metavar="DIR",
        help="for an adapter: the base model's directory (or its config.json); default: base_model_name_or_path",
    )
    progress_argument(parser)
    return parser


def run(args) -> int:
    from ..layout.files import convert_directory  # torch: loaded when the command runs

    result = convert_directory(args.src, args.dst, args.to, overwrite=args.overwrite, config_dir=args.config)
    print(f"{result.kind} {args.src}: rope_layout {result.source} -> {result.to}")
    for line in result.summary():
        print(line)
    print(f"wrote {args.dst}")
    return 0
