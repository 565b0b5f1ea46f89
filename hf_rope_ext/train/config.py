"""A fine-tuning request (:class:`FinetuneConfig`) and its checks, which run before anything is loaded or written:
numbers, the output folder, and what the model card takes from it.

Each field of :class:`FinetuneConfig` is one option of ``hf-rope-ext finetune``: the field's default is the
option's, its metadata (:func:`option`) the option's help and how the command reads it; ``hf_rope_ext.cli.finetune``
builds the flags from the fields. Nothing here imports torch, so that ``finetune --help`` does not either.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

from ..store.files import check_folder
from .checkpoints import latest_checkpoint, missing_part
from .csv_log import LOG_FILE
from .retrieval import check_retrieval
from .run_folder import check_free, resume_advice

RESULTS_FILE = "eval_results.json"
MERGED_DIR = "merged"
REQUIRED = MISSING  # the default of a field without one
GROUPS = ("what to train", "data", "LoRA", "optimization", "checkpoints, outputs, evaluation")  # of finetune --help
WHAT, DATA, LORA, OPTIMIZATION, RUN = GROUPS


def option(default, group: str, help: str = "", **flag):
    """A field that is a command-line option: its default (REQUIRED: a required option; a field whose default is
    False is a switch), its ``group`` and ``help`` in ``finetune --help``, and in ``flag`` what differs from a flag
    ``--field-name`` that takes one string: ``flag`` (another name), ``type`` (a checker of ``hf_rope_ext.cli.args``,
    by name), ``choices``, ``nargs`` (with ``const``, ``metavar``), ``shared`` (added by the helper that other
    subcommands use too)."""
    factory = MISSING
    if isinstance(default, (dict, list)):  # a fresh copy for each config (dataclasses refuse a shared default)
        default, factory = MISSING, default.copy
    return field(default=default, default_factory=factory, metadata={"group": group, "help": help, **flag})


@dataclass
class FinetuneConfig:
    """One fine-tuning job (:func:`hf_rope_ext.train.finetune` runs it); each field an option of the command."""

    model: str = option(REQUIRED, WHAT, shared="model")  # a folder or Hub id (the command: the bundled model if none)
    out: str = option(REQUIRED, WHAT, "new output folder (must not exist, unless resuming into it)")
    rope_type: str = option(REQUIRED, WHAT, shared="rope")
    length: int = option(REQUIRED, WHAT, "target context length in tokens", type="length")
    max_steps: int | None = option(
        None, WHAT, "optimizer steps (required unless --stages gives them)", type="positive_int"
    )
    factor: float | None = option(
        None, WHAT, "scaling factor s (>= 1; default: --length / the model's length)", shared="rope"
    )
    rope_extra: dict = option({}, WHAT, flag="--rope-param", shared="rope")  # further rope_parameters keys
    data: list[str] | None = option(
        None, DATA, "text files/folders, or one Hub dataset name (default: bundled corpus)", nargs="+"
    )
    eval_data: list[str] | None = option(
        None, DATA, "held-out text for perplexity (default: bundled eval split)", nargs="+"
    )
    text_column: str = option("text", DATA, "column of a Hub dataset that holds the text")
    packing: str = option("pack", DATA, "pack: concatenate documents", choices=("pack", "chunk"))
    # [(length, steps), ...]; on the command line 'length:steps,...' (parse_stages), beside --max-steps
    stages: list[tuple[int, int]] | None = option(
        None, WHAT, "progressive schedule 'length:steps,length:steps' (replaces --max-steps)"
    )
    position_schedule: str = option(
        "contiguous",
        DATA,
        "position ids of a training sequence (pose/random: short windows whose positions span --length)",
        choices=("contiguous", "pose", "random"),
    )
    window: int | None = option(
        None, DATA, "tokens per sequence for pose/random (default: the original length)", type="positive_int"
    )
    pose_chunks: int = option(2, DATA, "chunks per PoSE window", type="positive_int")
    retrieval: float = option(
        0.0,
        DATA,
        "share of training rows made retrieval rows: facts planted in the row's text, questions about them at its end, "
        "loss on the answers only (0: none)",
        type="probability",
    )
    retrieval_keys: int = option(3, DATA, "facts per retrieval row, each about another place", type="positive_int")
    retrieval_same_kind: float = option(
        0.0,
        DATA,
        "share of retrieval rows whose facts are all of one kind (every one a vault code, say), so only the place "
        "each names tells them apart, as in a multi-key probe (0: each fact's kind drawn on its own)",
        type="probability",
    )
    rank: int = option(8, LORA, "LoRA rank r", type="positive_int")
    alpha: float = option(16.0, LORA, "LoRA alpha (scale alpha / r)", type="positive_float")
    dropout: float = option(0.0, LORA, "LoRA dropout", type="probability")
    target_modules: tuple[str, ...] = option(
        ("q_proj", "k_proj", "v_proj", "o_proj"), LORA, "comma-separated linear layers", type="names"
    )
    train_embeddings: bool = option(False, LORA, "also train the input embeddings (LongLoRA)")
    train_norms: bool = option(False, LORA, "also train every norm layer (LongLoRA)")
    lr: float = option(2e-4, OPTIMIZATION, "peak learning rate (AdamW)", type="positive_float")
    warmup_steps: int = option(0, OPTIMIZATION, "linear warm-up steps", type="non_negative_int")
    scheduler: str = option("cosine", OPTIMIZATION, "transformers.get_scheduler name (linear, constant...)")
    weight_decay: float = option(0.0, OPTIMIZATION, "AdamW weight decay", type="non_negative_float")
    batch_size: int = option(1, OPTIMIZATION, "sequences per device per micro-batch", type="positive_int")
    grad_accum: int = option(1, OPTIMIZATION, "micro-batches per optimizer step", type="positive_int")
    grad_checkpointing: bool = option(False, OPTIMIZATION, "recompute activations (less memory)")
    offload_checkpoints: bool = option(
        False,
        OPTIMIZATION,
        "with --grad-checkpointing: keep each decoder layer's checkpointed input in host memory between its forward "
        "and its backward (pinned, copied on a side stream on CUDA)",
    )
    tiled_mlp: int | None = option(
        None,
        OPTIMIZATION,
        "compute each decoder layer's MLP over tiles of TOKENS tokens, recomputed tile by tile in the backward "
        "(no value or 0: about hidden-size tokens a tile, ALST's rule)",
        type="non_negative_int",
        nargs="?",
        const=0,
        metavar="TOKENS",
    )
    no_copies: bool = option(
        False,
        OPTIMIZATION,
        "in half precision: adapters read their input without an fp32 copy and Llama-style RMSNorms keep their "
        "half-precision input, not an fp32 copy, for the backward (the same numbers)",
    )
    sequence_parallel: int = option(
        1,
        OPTIMIZATION,
        "split each row's tokens over N processes (attention by an all-to-all over heads); processes = "
        "data-parallel x N, --batch-size counts rows per group of N",
        type="positive_int",
    )
    precision: str = option(
        "auto", OPTIMIZATION, "auto: bf16 on a GPU, else fp32", choices=("auto", "fp32", "bf16", "fp16")
    )
    seed: int = option(0, OPTIMIZATION, "seed of data order, LoRA init and positions", type="non_negative_int")
    save_every: int = option(0, RUN, "checkpoint every N steps, 0: only at the end", type="non_negative_int")
    resume_from: str | None = option(None, RUN, "a checkpoint folder OUT/checkpoints/step-NNNNNN")
    merge: bool = option(False, RUN, "also write OUT/merged: the full model, rope parameters kept")
    log_dir: str | None = option(None, RUN, "CSV (and TensorBoard) logs (default: OUT/logs)")
    eval_lengths: list[int] | None = option(
        None, RUN, "comma-separated lengths for perplexity before and after", type="lengths"
    )
    eval_rows: int = option(4, RUN, "documents per evaluation length", type="positive_int")
    passkey_depths: int = option(0, RUN, "passkey needle depths per length", type="non_negative_int")
    eval_far_context: bool = option(
        False,
        RUN,
        "far-context loss at each eval length >= L0, against the base model reading a sliding L0 window "
        "(loads the base model once more)",
    )


def parse_stages(text: str | None) -> list[tuple[int, int]] | None:
    """'1024:50,2048:100' -> [(1024, 50), (2048, 100)]."""
    if not text:
        return None
    try:
        stages = [tuple(int(x) for x in part.split(":")) for part in text.split(",")]
    except ValueError:
        stages = []
    if not stages or any(len(s) != 2 or s[0] < 2 or s[1] < 1 for s in stages):
        raise ValueError(f"--stages {text!r}: expected 'length:steps,length:steps' with length >= 2 and steps >= 1")
    return stages


# integers >= 1
POSITIVE = ("length", "batch_size", "grad_accum", "rank", "eval_rows", "pose_chunks", "sequence_parallel")
NON_NEGATIVE = ("warmup_steps", "save_every", "passkey_depths", "weight_decay")


def check_numbers(cfg: FinetuneConfig) -> None:
    """Counts, rates and the scheduler name, before anything is loaded."""
    from transformers import SchedulerType

    for key in POSITIVE:
        if int(getattr(cfg, key)) < 1:
            raise ValueError(f"{key}={getattr(cfg, key)!r} must be an integer >= 1")
    for key in NON_NEGATIVE:
        if getattr(cfg, key) < 0:
            raise ValueError(f"{key}={getattr(cfg, key)!r} must be >= 0")
    if not cfg.lr > 0:
        raise ValueError(f"lr={cfg.lr!r} must be > 0")
    if cfg.scheduler not in {t.value for t in SchedulerType}:
        raise ValueError(
            f"scheduler={cfg.scheduler!r} is not allowed; expected one of {[t.value for t in SchedulerType]}"
        )
    check_retrieval(cfg.retrieval, cfg.retrieval_keys, cfg.retrieval_same_kind)
    if any(int(n) < 2 for n in cfg.eval_lengths or ()):
        raise ValueError(f"eval_lengths={cfg.eval_lengths!r}: every length must be an integer >= 2")
    if cfg.tiled_mlp is not None and int(cfg.tiled_mlp) < 0:
        raise ValueError(f"tiled_mlp={cfg.tiled_mlp!r} must be an integer >= 0 (0: ALST's tile) or None (no tiles)")
    if cfg.offload_checkpoints and not cfg.grad_checkpointing:
        raise ValueError(
            "--offload-checkpoints keeps the inputs that activation checkpointing saves; add --grad-checkpointing"
        )
    odd = [n for n in cfg.eval_lengths or () if int(n) % cfg.sequence_parallel]
    if odd:
        raise ValueError(
            f"--eval-lengths {cfg.eval_lengths} with --sequence-parallel {cfg.sequence_parallel}: each evaluation row "
            f"is split over the group like a training row, and {odd[0]} tokens do not split into "
            f"{cfg.sequence_parallel}; use multiples of {cfg.sequence_parallel}"
        )


def check_output(cfg: FinetuneConfig) -> Path:
    """The output folder must not exist, except when resuming into it before it holds a finished adapter; a checkpoint
    to resume must be complete. A refusal never advises removing a folder that holds checkpoints: it names the newest
    complete one and the ``--resume-from`` that continues its run."""
    out = Path(cfg.out)
    if out.exists() and not cfg.resume_from:
        found = None if (out / "adapter_config.json").exists() else latest_checkpoint(out / "checkpoints")
        advice = f", the folder of a stopped run: {resume_advice(found)}; or" if found else ";"
        raise FileExistsError(f"--out {str(out)!r} exists{advice} choose a new folder (nothing was written)")
    if out.exists() and (out / "adapter_config.json").exists():
        raise FileExistsError(f"--out {str(out)!r} already holds a finished adapter; choose a new folder")
    if cfg.resume_from and not Path(cfg.resume_from).is_dir():
        raise FileNotFoundError(f"--resume-from {cfg.resume_from!r}: no such checkpoint folder")
    if cfg.resume_from:
        check_complete(cfg.resume_from, sizes=False)  # a part missing (an unfinished checkpoint), named as such
        check_folder(cfg.resume_from)  # optimizer, scheduler, RNG and adapter states, before the model loads
        check_complete(cfg.resume_from)
    if cfg.log_dir and (Path(cfg.log_dir) / LOG_FILE).exists() and not cfg.resume_from:
        raise FileExistsError(f"--log-dir {cfg.log_dir!r} already holds a {LOG_FILE}; choose a new folder")
    check_free(out, cfg.resume_from)
    return out


def check_complete(resume_from, sizes: bool = True) -> None:
    """``--resume-from`` must be a complete checkpoint (``checkpoints.missing_part``; ``sizes``: its files' sizes
    too); ValueError naming what it lacks and the newest complete checkpoint beside it."""
    missing = missing_part(resume_from, sizes)
    if missing is None:
        return
    found = latest_checkpoint(Path(resume_from).parent)
    beside = f"the newest complete one beside it is {str(found)!r}" if found else "no complete one is beside it"
    raise ValueError(f"--resume-from {str(resume_from)!r} is not a complete checkpoint: it lacks {missing}; {beside}")


def training_summary(cfg: FinetuneConfig) -> dict:
    """Hyperparameters for the model card (no paths)."""
    keep = {
        k: v for k, v in asdict(cfg).items() if k not in ("model", "out", "data", "eval_data", "resume_from", "log_dir")
    }
    return {k: (json.dumps(v) if isinstance(v, (list, tuple, dict)) else v) for k, v in keep.items() if v is not None}
