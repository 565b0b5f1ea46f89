"""``hf-rope-ext extend``: the main job. With no arguments: the bundled model, every applicable rope type at 1x, 2x,
4x and 8x its pretraining length; tables (perplexity, far-context loss against the sliding-window baseline, passkey
accuracy), a perplexity-against-length plot, a passkey heatmap grid (depth x length per method) and a JSON report.
With ``--rope-type T --factor F --out DIR``: also save the patched model with its model card."""

from __future__ import annotations

import resource
import shlex
import time
from pathlib import Path

from ..store import bundled, outputs
from . import ruler_cmd
from .args import comma_list, factor, model_argument, non_negative_int, positive_int, progress_argument
from .eval_cmd import add_rope_arguments


def add_parser(subparsers, name):
    parser = subparsers.add_parser(name, help="compare RoPE extension methods on a model; save a patched model")
    model_argument(parser)
    add_rope_arguments(parser)
    parser.add_argument(
        "--factors",
        type=comma_list(factor),
        default=None,
        help="factors s (>= 1) to compare at s x L0 (default 2,4,8; 2,4 for a long model, see below)",
    )
    parser.add_argument("--out", type=Path, default=None, help="save the patched model, card and report here")
    parser.add_argument("--report-dir", type=Path, default=None, help="where the report goes without --out")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an existing --out / --report-dir, replacing only the files this command writes",
    )
    parser.add_argument(
        "--data",
        nargs="+",
        default=None,
        help="text files or folders, or 'python-docs' (default: the bundled eval split; python-docs for a long model)",
    )
    parser.add_argument("--documents", type=positive_int, default=None, help="documents per length (default 3)")
    parser.add_argument(
        "--last-chunk", type=non_negative_int, default=None, help="last-chunk loss chunk size (default 128; 0: skip)"
    )
    parser.add_argument(
        "--passkey-depths",
        type=non_negative_int,
        default=None,
        help="teacher-forced passkey depths per length (default 5; 0: skip)",
    )
    parser.add_argument("--passkey-trials", type=positive_int, default=1, help="pass keys per depth (default 1)")
    parser.add_argument(
        "--far-stride",
        type=positive_int,
        default=None,
        help="sliding-window baseline stride (default 16; L0/8 for a long model; 1: exact)",
    )
    parser.add_argument("--generate", action="store_true", help="passkey by greedy generation too (slower)")
    parser.add_argument(
        "--passkey-prompts",
        type=non_negative_int,
        default=None,
        help="pass keys by greedy generation: prompts per length, each read once and asked --passkey-keys "
        "questions through its KV cache (default 0: none; 1 for a long model)",
    )
    parser.add_argument(
        "--passkey-keys", type=positive_int, default=3, help="pass keys per --passkey-prompts prompt (default 3)"
    )
    parser.add_argument(
        "--methods",
        type=comma_list(str),
        default=None,
        help="comma-separated rope types to compare, 'none' for the model as saved (default: every applicable one)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weights and activations (default float32; bfloat16 for a long model, 1.4x faster on a CPU with bf16)",
    )
    parser.epilog = (
        f"A long model (trained at >= {LONG_MODEL} tokens, such as SmolLM2 at 8192) gets defaults that bound the run: "
        "--factors 2,4 --documents 1 --last-chunk 0 --passkey-depths 0 --passkey-prompts 1 --far-stride L0/8 "
        "--data python-docs --dtype bfloat16 (any of them given is kept)."
    )
    ruler_cmd.add_arguments(parser)
    progress_argument(parser)
    return parser


def factor_list(args) -> list[float]:
    return [args.factor] if args.factor is not None else list(args.factors)


def run(args) -> int:
    from ..eval import compare, extend_report, loading, parse_rope_params  # torch: loaded when the command runs
    from ..eval.metadata import run_metadata
    from ..eval.runner import EvalPlan

    started = time.time()
    if args.out is not None and args.rope_type in loading.NONE_TYPES:
        raise ValueError("--out saves a patched model: pass --rope-type (and --factor where the type takes one)")
    target = args.out or args.report_dir or Path("runs") / time.strftime("extend-%Y%m%d-%H%M%S")
    flag = "--out" if args.out is not None else "--report-dir"
    stage = outputs.Staged(target, args.overwrite, flag, writes_card=args.out is not None)  # refused before any work
    path = loading.check_model_path(args.model or bundled.default_model_path())
    pretrain = loading.pretraining_length(loading.load_config(path))
    fill_defaults(args, pretrain)
    extra = parse_rope_params(args.rope_param)
    if extra and args.rope_type is None and args.methods is None:
        raise ValueError(f"--rope-param {sorted(extra)} given without --rope-type or --methods")
    methods = chosen_methods(args)
    if args.ruler is not None:  # lm-eval's RULER tasks across the methods instead of extend's own measures
        return ruler_cmd.run_extend(args, path, methods, factor_list(args))
    plan = EvalPlan(
        lengths=(2,),  # placeholder: run_comparison picks the lengths from the factors
        documents=args.documents,
        last_chunk=args.last_chunk or None,
        passkey_depths=args.passkey_depths,
        passkey_trials=args.passkey_trials,
        generate=args.generate,
        far_context=True,
        far_stride=args.far_stride,
        multikey_prompts=args.passkey_prompts,
        multikey_keys=args.passkey_keys,
    )
    records = compare.run_comparison(
        path, methods, factor_list(args), plan, args.data, not args.no_progress, extra, dtype=args.dtype
    )
    meta = run_metadata(path, command_line(args), data=args.data, dtype=args.dtype, device="cpu")
    model = args.model or f"{bundled.default_model_path()} (bundled)"
    text = extend_report.markdown(
        records, plan, meta, model=str(model), data=args.data, dtype=args.dtype, peak_gib=peak_memory_gib()
    )
    with stage as out:  # written into a temporary sibling, renamed at the end
        written = extend_report.write_files(records, plan, text, out, name=path.name, pretrain=pretrain, meta=meta)
        if args.out is not None:
            chosen = [r for r in records if r["rope_type"] in (args.rope_type, "none") and "perplexity" in r]
            length = int(max(factor_list(args)) * pretrain)
            compare.save_extended(
                path, args.rope_type, args.factor, out, chosen, "perplexity.png", extra, target, length
            )
            written += [("model", ""), ("card", "README.md")]
    print(text)
    for what, name in written:
        print(f"{what}: {target / name}")
    print(f"done in {time.time() - started:.0f} s, peak resident memory {peak_memory_gib():.2f} GiB")
    return 0


LONG_MODEL = 4096  # from this pretraining length on, a forward pass at 4x costs minutes on a CPU


def fill_defaults(args, pretrain: int) -> None:
    """Give every measure option left unset its default: the bundled-model defaults, or for a model trained at
    LONG_MODEL tokens or more the bounded ones (one document, one 3-key prompt per length, no last-chunk or
    teacher-forced passkey, a coarser baseline stride, the long python-docs documents, bfloat16)."""
    long = pretrain >= LONG_MODEL
    defaults = {
        "factors": [2.0, 4.0] if long else [2.0, 4.0, 8.0],
        "documents": 1 if long else 3,
        "last_chunk": 0 if long else 128,
        "passkey_depths": 0 if long else 5,
        "passkey_prompts": 1 if long else 0,
        "far_stride": max(1, pretrain // 8) if long else 16,
        "data": ["python-docs"] if long else None,
        "dtype": "bfloat16" if long else "float32",
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def chosen_methods(args) -> list | None:
    """The methods to compare: --methods ('none' = as saved), else the model as saved and --rope-type, else all."""
    if args.methods is not None and args.rope_type is not None:
        raise ValueError("--methods and --rope-type: give one of them (--rope-type with --out saves that method)")
    if args.methods is not None:
        return [None if m in ("none", "default") else m for m in args.methods]
    return None if args.rope_type is None else [None, args.rope_type]


def peak_memory_gib() -> float:
    """The peak resident memory of this process so far, GiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def command_line(args) -> str:
    """An ``hf-rope-ext extend`` command line that repeats this run (every measure's option spelled out)."""
    words = ["hf-rope-ext", "extend"] + (["--model", str(args.model)] if args.model else [])
    if args.methods is not None:
        words += ["--methods", ",".join(args.methods)]
    if args.rope_type is not None:
        words += ["--rope-type", args.rope_type] + ([] if args.factor is None else ["--factor", f"{args.factor:g}"])
        words += [w for p in args.rope_param for w in ("--rope-param", p)]
    if args.factor is None:
        words += ["--factors", ",".join(f"{f:g}" for f in args.factors)]
    words += [] if args.data is None else ["--data", *args.data]
    for option in ("documents", "last_chunk", "passkey_depths", "passkey_trials", "far_stride", "passkey_prompts"):
        words += ["--" + option.replace("_", "-"), str(getattr(args, option))]
    words += ["--passkey-keys", str(args.passkey_keys)] if args.passkey_prompts else []
    words += ["--dtype", args.dtype] if args.dtype != "float32" else []
    return shlex.join(words + (["--generate"] if args.generate else []))
