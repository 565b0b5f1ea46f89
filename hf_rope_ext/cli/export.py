"""``hf-rope-ext export SRC DST``: a copy of a saved model whose rope config stock transformers and others read."""

from __future__ import annotations

from .args import progress_argument


def add_parser(subparsers, name):
    parser = subparsers.add_parser(
        name,
        help="write a portable copy: rope types lowered to stock forms when exactly equivalent",
        description=(
            "Rewrite SRC's rope config into the stock form other engines read (ntk -> default with a scaled "
            "rope_theta, ntk_by_parts -> yarn with attention_factor 1, other static schedules -> longrope), checked "
            "numerically first. Dynamic and attention-level types are refused unless --remote-code."
        ),
    )
    parser.add_argument("src", help="saved model directory (only read)")
    parser.add_argument("dst", help="new directory to write")
    parser.add_argument("--remote-code", action="store_true", help="ship types with no stock form as trust_remote_code")
    parser.add_argument(
        "--overwrite", action="store_true", help="write into an existing DST, replacing only the files export writes"
    )
    parser.add_argument("--base-model", help="Hub id of the base model, for the model card")
    parser.add_argument("--license", help="license identifier for the model card (e.g. apache-2.0)")
    progress_argument(parser)
    return parser


def run(args) -> int:
    from ..publish.export import export  # torch: loaded when the command runs

    result = export(
        args.src,
        args.dst,
        remote_code=args.remote_code,
        overwrite=args.overwrite,
        base_model=args.base_model,
        license=args.license,
    )
    source = result.source_rope_parameters.get("rope_type", "default")
    target = result.rope_parameters.get("rope_type", "default")
    print(f"{result.mode}: rope_type {source} -> {target} in {result.directory}")
    if result.max_rel_error is not None:
        print(
            f"checked against transformers' rotary module: max relative inv_freq difference {result.max_rel_error:.3g}"
        )
    for line in result.output_notes:
        print(line)
    if result.mode == "remote-code":
        print("load with AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)")
    return 0
