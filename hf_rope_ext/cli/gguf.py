"""``hf-rope-ext gguf``: a GGUF file with a frequency-level extension written as llama.cpp's rope scaling keys."""

from __future__ import annotations

from pathlib import Path

from ..store import gguf_rope
from ..types import rope_parameters
from .args import add_rope_arguments


def add_parser(subparsers, name):
    parser = subparsers.add_parser(
        name,
        help="copy a GGUF file with llama.cpp rope scaling keys (linear or yarn) for llama.cpp and ollama",
        description=(
            "Copy SRC (every tensor as it is, quantized or not) to --out with <arch>.rope.scaling.type, .factor and "
            ".original_context_length set, and <arch>.context_length = factor x the original length. llama.cpp "
            "and ollama then run the extension; hf-rope-ext reads the keys back when it loads the file."
        ),
    )
    parser.add_argument("src", metavar="SRC", help="a .gguf file (only read)")
    add_rope_arguments(parser, rope_type_required=True)
    parser.add_argument("--out", type=Path, required=True, help="the .gguf file to write (must not exist)")
    return parser


def run(args) -> int:
    from ..eval import parse_rope_params  # torch: loaded when the command runs

    if args.rope_type not in gguf_rope.TYPES:
        raise ValueError(f"--rope-type {args.rope_type!r}: llama.cpp's GGUF rope scaling takes {list(gguf_rope.TYPES)}")
    extra = parse_rope_params(args.rope_param)
    factor = {} if args.factor is None else {"factor": args.factor}
    params = rope_parameters.rope_parameters_for(args.src, args.rope_type, **factor, **extra)
    print(f"wrote {gguf_rope.export_gguf(args.src, args.out, params)} with rope_parameters {params}")
    return 0
