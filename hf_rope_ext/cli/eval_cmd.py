"""``hf-rope-ext eval``: perplexity, last-chunk loss, passkey and needle-in-a-haystack for one model and rope type."""

from __future__ import annotations

from pathlib import Path


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lengths {text!r}: expected comma-separated integers, e.g. 512,1024,2048") from None
    if not values:
        raise ValueError(f"--lengths {text!r}: expected at least one length")
    return values


def add_rope_arguments(parser) -> None:
    """--rope-type, --factor, --rope-param (shared with ``extend``)."""
    parser.add_argument("--rope-type", default=None, help="rope type to apply (default: the model as saved)")
    parser.add_argument("--factor", type=float, default=None, help="scaling factor s of the rope type")
    parser.add_argument(
        "--rope-param", action="append", default=[], metavar="KEY=VALUE", help="another rope parameter (repeatable)"
    )


def add_parser(subparsers, name):
    parser = subparsers.add_parser(name, help="evaluate a causal LM at several lengths with any rope type")
    parser.add_argument("--model", default=None, help="model directory (default: the bundled tiny-llama-stdlib)")
    add_rope_arguments(parser)
    parser.add_argument("--lengths", default=None, help="comma-separated lengths (default: L0, 2 L0, 4 L0)")
    parser.add_argument("--data", nargs="+", default=None, help="text files or folders (default: bundled eval split)")
    parser.add_argument("--documents", type=int, default=None, help="documents per length (default: all)")
    parser.add_argument("--last-chunk", type=int, default=128, help="chunk size for last-chunk loss (0: skip)")
    parser.add_argument("--passkey-depths", type=int, default=5, help="needle depths for passkey (0: skip)")
    parser.add_argument("--passkey-trials", type=int, default=1, help="pass keys per depth")
    parser.add_argument("--no-generate", action="store_true", help="passkey teacher-forced only, no generation")
    parser.add_argument("--needle", type=Path, default=None, help="write a needle-in-a-haystack heatmap PNG here")
    parser.add_argument("--needle-depths", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="write the records as JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a perplexity-against-length PNG here")
    parser.add_argument("--overwrite", action="store_true", help="replace existing --json/--plot/--needle files")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def check_outputs(paths, overwrite: bool) -> None:
    for path in paths:
        if path is not None and Path(path).exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass --overwrite to replace it")


def run(args) -> int:
    from transformers import AutoConfig

    from .. import bundled
    from ..eval import EvalPlan, evaluate, load_model, load_tokenizer, loading, needle_grid, parse_rope_params, report

    check_outputs([args.json, args.plot, args.needle], args.overwrite)
    path = loading.check_model_path(args.model or bundled.default_model_path())
    pretrain = loading.pretraining_length(AutoConfig.from_pretrained(path))
    lengths = int_list(args.lengths) if args.lengths else [pretrain, 2 * pretrain, 4 * pretrain]
    extra = parse_rope_params(args.rope_param)
    plan = EvalPlan(
        lengths=tuple(lengths),
        documents=args.documents,
        last_chunk=args.last_chunk or None,
        passkey_depths=args.passkey_depths,
        passkey_trials=args.passkey_trials,
        generate=not args.no_generate,
    )
    records = evaluate(path, args.rope_type, args.factor, extra, plan, args.data, progress=not args.no_progress)
    grid = None
    if args.needle:  # before writing anything, so a failure leaves no partial outputs
        model = load_model(path, records[0]["rope_parameters"])
        grid, depths = needle_grid(model, load_tokenizer(path), lengths, args.needle_depths, args.data)
    print(report.markdown_table(records))
    if args.json:
        print(f"records: {report.write_json(records, args.json)}")
    if args.plot:
        print(f"plot: {report.plot_perplexity(records, args.plot, pretrain)}")
    if grid is not None:
        title = f"needle in a haystack: {records[0]['rope_type']}" + (f" x{args.factor:g}" if args.factor else "")
        print(f"needle heatmap: {report.plot_heatmap(grid.numpy(), depths, lengths, args.needle, title)}")
    return 0
