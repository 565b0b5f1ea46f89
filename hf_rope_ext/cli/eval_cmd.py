"""``hf-rope-ext eval``: perplexity, last-chunk loss, passkey and needle-in-a-haystack for one model and rope type."""

from __future__ import annotations

from pathlib import Path

from . import eval_split, probes_cmd, ruler_cmd
from .args import (
    add_rope_arguments,
    comma_list,
    length,
    model_argument,
    non_negative_int,
    positive_int,
    progress_argument,
)

__all__ = ["add_parser", "add_rope_arguments", "run"]  # add_rope_arguments: also used by `extend`


def add_parser(subparsers, name):
    parser = subparsers.add_parser(name, help="evaluate a causal LM at several lengths with any rope type")
    model_argument(parser)
    parser.add_argument(
        "--adapter",
        type=Path,
        default=None,
        help="a peft LoRA adapter folder to evaluate on its base (--model, else the adapter's base model), unmerged; "
        "an adapter folder given as --model works too",
    )
    add_rope_arguments(parser)
    parser.add_argument(
        "--lengths", type=comma_list(length), default=None, help="comma-separated lengths (default: L0, 2 L0, 4 L0)"
    )
    parser.add_argument("--data", nargs="+", default=None, help="text files or folders (default: bundled eval split)")
    parser.add_argument("--documents", type=positive_int, default=None, help="documents per length (default: all)")
    parser.add_argument(
        "--last-chunk", type=non_negative_int, default=128, help="chunk size for last-chunk loss (0: skip)"
    )
    parser.add_argument(
        "--passkey-depths", type=non_negative_int, default=5, help="needle depths for passkey (0: skip)"
    )
    parser.add_argument("--passkey-trials", type=positive_int, default=1, help="pass keys per depth")
    parser.add_argument("--no-generate", action="store_true", help="passkey teacher-forced only, no generation")
    parser.add_argument("--needle", type=Path, default=None, help="write a needle-in-a-haystack heatmap PNG here")
    parser.add_argument("--needle-depths", type=positive_int, default=5, help="needle depths of the heatmap")
    parser.add_argument(
        "--tiled-mlp",
        type=non_negative_int,
        nargs="?",
        const=0,
        default=None,
        metavar="TOKENS",
        help="compute each decoder layer's MLP over tiles of TOKENS tokens, as finetune --tiled-mlp trains (no value "
        "or 0: about hidden-size tokens a tile)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the records as JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a perplexity-against-length PNG here")
    parser.add_argument("--overwrite", action="store_true", help="replace existing --json/--plot/--needle files")
    eval_split.add_argument(parser)
    ruler_cmd.add_arguments(parser, eval_command=True)
    probes_cmd.add_arguments(parser)
    progress_argument(parser)
    return parser


def run(args) -> int:
    eval_split.check_measures(args)
    if args.probes is not None:
        probes_cmd.check(args)
    else:
        probes_cmd.check_unused(args)
    if args.ruler is not None:  # lm-eval's RULER tasks instead of the package's probes
        return ruler_cmd.run_eval(args)
    from ..eval import (
        EvalPlan,
        adapters,
        evaluate,
        load_model,
        load_tokenizer,
        loading,
        needle_grid,
        parse_rope_params,
        report,
        requested_parameters,
    )
    from ..eval.metadata import run_metadata
    from ..store import bundled, outputs
    from ..train.memory.techniques import tile_model

    for flag, path in (("--json", args.json), ("--plot", args.plot), ("--needle", args.needle)):
        outputs.check_file(path, args.overwrite, flag)
    path, adapter = adapters.split(args.model, args.adapter)
    path = path or bundled.default_model_path()
    pretrain = loading.pretraining_length(loading.load_config(adapters.config_folder(path, adapter)))
    lengths = args.lengths or [pretrain, 2 * pretrain, 4 * pretrain]
    eval_split.check_lengths(args, lengths)
    extra = parse_rope_params(args.rope_param)
    if args.probes is not None:  # the pass-key probes of a split instead of the default measures
        params = requested_parameters(
            loading.load_config(adapters.config_folder(path, adapter)), args.rope_type, args.factor, extra
        )
        return probes_cmd.run(args, path, adapter, lengths, params)
    plan = EvalPlan(
        lengths=tuple(lengths),
        documents=args.documents,
        last_chunk=args.last_chunk or None,
        passkey_depths=args.passkey_depths,
        passkey_trials=args.passkey_trials,
        generate=not args.no_generate,
    )
    tiles = lambda model: tile_model(model, args.tiled_mlp)  # noqa: E731
    reader, losses, predict, main = eval_split.reading(args)
    progress = not args.no_progress and main
    records = evaluate(
        path, args.rope_type, args.factor, extra, plan, args.data, progress, adapter, tiles, losses, predict
    )
    if not main:  # a split run's other processes computed the same records: the first reports them
        return 0
    records = eval_split.stamped(records, reader)
    grid = depths = None
    if args.needle:  # before writing anything, so a failure leaves no partial outputs
        model = load_model(path, records[0]["rope_parameters"], adapter=adapter)
        tile_model(model, args.tiled_mlp)
        tokenizer = load_tokenizer(adapters.tokenizer_folder(path, adapter))
        grid, depths = needle_grid(model, tokenizer, lengths, args.needle_depths, args.data)
    print(report.markdown_table(records))
    title = f"needle in a haystack: {records[0]['rope_type']}" + (f" x{args.factor:g}" if args.factor else "")
    writers = {
        args.json: lambda tmp: report.write_json(
            records, tmp, run_metadata(path, args._command, adapter, args.data, "float32", "cpu")
        ),  # evaluate's model
        args.plot: lambda tmp: report.plot_perplexity(records, tmp, pretrain),
        args.needle: lambda tmp: report.plot_heatmap(grid.numpy(), depths, lengths, tmp, title),
    }
    outputs.write_files({path: write for path, write in writers.items() if path is not None})
    for what, path in (("records", args.json), ("plot", args.plot), ("needle heatmap", args.needle)):
        if path is not None:
            print(f"{what}: {path}")
    return 0
