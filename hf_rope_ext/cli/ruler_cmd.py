"""``--ruler TASKS`` of ``hf-rope-ext eval`` and ``hf-rope-ext extend``: lm-eval's RULER tasks (``eval.ruler``) on
the model with the chosen rope type, or on every method ``extend`` compares, into ``report.json``, ``report.md`` and
``ruler.png`` in a report folder. With ``--ruler`` the commands run RULER only (not their own probes)."""

from __future__ import annotations

import time
from pathlib import Path

from ..store import bundled, outputs
from .args import comma_list, positive_int

PLOT = "ruler.png"


def add_arguments(parser, eval_command: bool = False) -> None:
    """--ruler and --limit (both commands); --report-dir and --dtype for ``eval`` (``extend`` has its own)."""
    parser.add_argument(
        "--ruler",
        type=comma_list(str),
        nargs="?",
        const=["default"],
        default=None,
        metavar="TASKS",
        help="run lm-eval's RULER tasks instead of the package's probes (needs the [eval] extra): comma-separated "
        "names, 'default' (or nothing) for those whose data is made offline (niah_single_1, niah_multikey_2, "
        "niah_multikey_3, ruler_vt, ruler_cwe, ruler_fwe), 'all' for every one",
    )
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="with --ruler: samples read per task and length (default: all 500 that lm-eval builds)",
    )
    parser.add_argument(
        "--max-gen-toks",
        type=positive_int,
        default=None,
        help="with --ruler: tokens generated per answer (default: each task's own, 128 for the needle tasks); "
        "fewer is faster and can only lower a score",
    )
    parser.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="with --ruler: put each prompt in the tokenizer's chat template (lm-eval's own option; for instruct "
        "models, which were trained to read their input that way)",
    )
    if eval_command:
        parser.add_argument("--report-dir", type=Path, default=None, help="with --ruler: the report folder")
        parser.add_argument(
            "--dtype",
            choices=("float32", "bfloat16"),
            default="float32",
            help="with --ruler or --probes: weights and activations",
        )


def prepare(args) -> list[str]:
    """The tasks, checked, with the network notes printed, before any work."""
    from ..eval import ruler_tasks

    tasks = ruler_tasks.resolve(args.ruler)
    ruler_tasks.require_lm_eval()
    for line in ruler_tasks.network_notes(tasks):
        print(f"note: {line}")
    return tasks


def report_stage(args, prefix: str):
    target = args.report_dir or Path("runs") / time.strftime(f"{prefix}-%Y%m%d-%H%M%S")
    return target, outputs.Staged(target, args.overwrite, "--report-dir")


def run_eval(args) -> int:
    """``hf-rope-ext eval --ruler``: one model, one rope type, at ``--lengths`` (default L0, 2 L0, 4 L0)."""
    from ..eval import adapters, loading, parse_rope_params, ruler

    tasks = prepare(args)
    for flag in ("json", "plot", "needle"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag} with --ruler: the RULER report goes to --report-dir (report.json, {PLOT})")
    target, stage = report_stage(args, "ruler")
    path, adapter = adapters.split(args.model, args.adapter)
    path = path or bundled.default_model_path()
    pretrain = loading.pretraining_length(loading.load_config(adapters.config_folder(path, adapter)))
    lengths = args.lengths or [pretrain, 2 * pretrain, 4 * pretrain]
    extra = parse_rope_params(args.rope_param)
    records = ruler.evaluate_path(
        path, args.rope_type, args.factor, extra, tasks, lengths, args.limit, adapter, args.dtype, **gen(args)
    )
    return write(records, args, path, target, stage, adapter)


def run_extend(args, path: Path, methods, factors) -> int:
    """``hf-rope-ext extend --ruler``: every method at the lengths and with the parameters ``extend`` uses."""
    from ..eval import parse_rope_params, ruler

    tasks = prepare(args)
    if args.out is not None:
        raise ValueError("--out with --ruler: --ruler writes a report only; give --report-dir (or drop --ruler)")
    target, stage = report_stage(args, "extend-ruler")
    extra = parse_rope_params(args.rope_param)
    progress = not args.no_progress
    records = ruler.compare(path, methods, factors, tasks, args.limit, extra, args.dtype, progress, **gen(args))
    return write(records, args, path, target, stage)


def gen(args) -> dict:
    """What reaches ``eval.ruler.run_tasks``: the generated tokens per answer and the chat template."""
    kw = {} if args.max_gen_toks is None else {"max_gen_toks": args.max_gen_toks}
    return kw | ({"chat_template": True} if args.apply_chat_template else {})


def write(records, args, path, target: Path, stage, adapter=None) -> int:
    from ..eval import report, ruler_report
    from ..eval.metadata import run_metadata

    meta = run_metadata(path, getattr(args, "_command", ""), adapter, dtype=args.dtype, device="cpu")
    limit = f"the first {args.limit}" if args.limit else "all"
    text = "\n".join(
        [
            f"# RULER (lm-evaluation-harness {meta_version('lm-eval')}) on `{path}`",
            "",
            f"- command: `{meta['command']}`",
            f"- samples: {limit} of the 500 lm-eval builds per task and length; lm-eval reads at most the length",
            f"- date: {meta['date']}, dtype {args.dtype}, generated tokens per answer: "
            f"{args.max_gen_toks or 'each task' + chr(39) + 's own (128 for the needle tasks)'}, prompts "
            + ("in the tokenizer's chat template" if args.apply_chat_template else "as plain text (no chat template)"),
            "",
            ruler_report.tables(records),
        ]
    )
    with stage as out:
        (out / "report.md").write_text(text, encoding="utf-8")
        report.write_json(records, out / "report.json", {**meta, "lm_eval": meta_version("lm-eval")})
        ruler_report.plot(records, out / PLOT, f"{Path(path).name}: RULER (lm-eval) score against length")
    print(text)
    for name in ("report.md", "report.json", PLOT):
        print(f"{name}: {target / name}")
    return 0


def meta_version(name: str) -> str | None:
    from ..eval.metadata import version

    return version(name)
