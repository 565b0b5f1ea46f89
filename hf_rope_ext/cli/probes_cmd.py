"""``--probes classic,multikey`` of ``hf-rope-ext eval``: the pass-key probes of a split (``eval.splits``), scored
``hits/n [lo, hi]`` with Wilson 95% intervals, instead of the default measures. ``--log`` makes a run resumable."""

from __future__ import annotations

from pathlib import Path

from .args import comma_list, positive_int

DEFAULT_SAMPLES = 10


def add_arguments(parser) -> None:
    parser.add_argument(
        "--probes",
        type=comma_list(str),
        default=None,
        metavar="PROBES",
        help="run the pass-key probes instead of the default measures: comma-separated, 'classic' (one key per "
        "prompt) and/or 'multikey' (three keys per prompt, each naming another object)",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="with --probes: 'dev' (default; for choosing methods and parameters) or 'test' (held out: other seed, "
        "filler, wordings, key lengths and depths; for reporting)",
    )
    parser.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help=f"with --probes: prompts per probe and length (default {DEFAULT_SAMPLES}; a multikey prompt asks 3 keys)",
    )
    parser.add_argument(
        "--seeds-of-length",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="with --split test: each prompt's keys, objects, wordings and depths drawn from the prompt of the same "
        "index at this length (less filler), so runs at two lengths pair prompt by prompt",
    )
    parser.add_argument(
        "--chat-template",
        action="store_true",
        help="with --split test: each prompt as the user turn of the model's chat template, each answer stem "
        "opening the assistant turn (the template's tokens count towards the length)",
    )
    parser.add_argument(
        "--log",
        type=Path,
        default=None,
        help="with --probes: append every answered prompt to this JSON-lines file; a rerun with the same model, "
        "adapter, rope parameters and dtype asks only the prompts it does not hold yet",
    )


def check(args) -> None:
    """Refuse, before any work, what --probes cannot be combined with and values it does not take."""
    from ..eval import splits

    if args.ruler is not None:
        raise ValueError("--probes with --ruler: run one of them at a time")
    if args.needle is not None:
        raise ValueError("--needle with --probes: the needle heatmap is one of the default measures; drop one")
    for kind in args.probes:
        splits.check(args.split or "dev", kind)
    for flag in ("seeds_of_length", "chat_template"):
        if getattr(args, flag) not in (None, False) and args.split != "test":
            raise ValueError(
                f"--{flag.replace('_', '-')} with --split {args.split or 'dev'}: a variant of the test split"
            )


def check_unused(args) -> None:
    """--split, --samples, --log and the test split's variants without --probes are refused (they would change
    nothing)."""
    for flag in ("split", "samples", "log", "seeds_of_length", "chat_template"):
        if getattr(args, flag) not in (None, False):
            raise ValueError(f"--{flag.replace('_', '-')} without --probes: it only applies to the pass-key probes")


def run(args, path, adapter, lengths: list[int], requested) -> int:
    """Every probe of ``args.probes`` at every length on the model loaded with the ``requested`` rope parameters
    (None: as saved, or as the adapter was trained); prints the table, writes --json / --plot."""
    import torch

    from ..eval import adapters, loading, metadata, probes, report
    from ..eval.probe_report import plot_probes, probe_table
    from ..store import outputs

    for flag, file in (("--json", args.json), ("--plot", args.plot)):
        outputs.check_file(file, args.overwrite, flag)
    model = loading.load_model(path, requested, dtype=getattr(torch, args.dtype), adapter=adapter)
    model = model.merge_and_unload() if adapter is not None else model  # the probes read a plain model's cache
    tokenizer = loading.load_tokenizer(adapters.tokenizer_folder(path, adapter))
    device, written = next(model.parameters()).device, [args.log] if args.log else []
    meta = metadata.run_metadata(path, args._command, adapter, dtype=args.dtype, device=device, exclude=written)
    params = rope_parameters_of(model)  # as the model reads them: an adapter's own, or the model's as saved
    cell = {k: meta[k] for k in ("model_sha256", "adapter_sha256")} | {"rope_parameters": params, "dtype": args.dtype}
    name = adapters.adapter_label(adapter) if adapter is not None else report_label(params)
    log = None if args.log is None else probes.ProbeLog(args.log, cell, meta["provenance"])
    records, split, samples = [], args.split or "dev", args.samples or DEFAULT_SAMPLES
    variant = {"seeds_of": args.seeds_of_length, "chat": args.chat_template} if split == "test" else {}
    for kind in args.probes:
        for n in lengths:
            found = probes.run_probes(model, tokenizer, split, kind, n, samples, log, not args.no_progress, **variant)
            provenance = {"provenance": meta["provenance"]}
            records.append({"rope_type": name, "factor": args.factor, **found, **cell, **variant, **provenance})
    print(probe_table(records))
    meta |= {"adapter_training_command": adapters.training_command(adapter)} if adapter is not None else {}
    writers = {
        args.json: lambda tmp: report.write_json(records, tmp, meta),
        args.plot: lambda tmp: plot_probes(records, tmp, f"pass keys ({split} split): {name}"),
    }
    outputs.write_files({file: write for file, write in writers.items() if file is not None})
    for what, file in (("records", args.json), ("plot", args.plot), ("probe log", args.log)):
        if file is not None:
            print(f"{what}: {file}")
    return 0


def rope_parameters_of(model) -> dict:
    """The rope parameters the loaded model runs with (its text config's), as plain JSON values."""
    config = model.config.get_text_config(decoder=True)
    return dict(config.rope_parameters or {})


def report_label(params: dict) -> str:
    """The row of the model as loaded: its rope type and factor ("yarn x4", "self_extend", "none")."""
    from ..eval.runner import label

    rope_type = label(params.get("rope_type"))
    return rope_type + (f" x{params['factor']:g}" if "factor" in params and rope_type != "none" else "")
