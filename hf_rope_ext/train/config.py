"""A fine-tuning request (:class:`FinetuneConfig`) and its checks, which run before anything is loaded or written:
numbers, stages, the output folder, and what the loop and the model card take from it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..store.files import check_folder
from .csv_log import LOG_FILE
from .loop import LoopSettings, Stage
from .positions import check_schedule
from .run_folder import check_free

RESULTS_FILE = "eval_results.json"
MERGED_DIR = "merged"


@dataclass
class FinetuneConfig:
    model: str
    out: str
    rope_type: str
    length: int
    max_steps: int | None = None
    factor: float | None = None
    rope_extra: dict = field(default_factory=dict)  # further rope_parameters keys of the type
    data: list[str] | None = None  # files, folders or one Hub dataset name; None: the bundled corpus' train split
    eval_data: list[str] | None = None  # held-out text for perplexity; None: the bundled eval split (or --data)
    text_column: str = "text"
    packing: str = "pack"
    stages: list[tuple[int, int]] | None = None  # (length, steps) progressive schedule
    position_schedule: str = "contiguous"
    window: int | None = None  # tokens per sequence for pose/random (default: the model's original length)
    pose_chunks: int = 2
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    train_embeddings: bool = False
    train_norms: bool = False
    lr: float = 2e-4
    warmup_steps: int = 0
    scheduler: str = "cosine"
    weight_decay: float = 0.0
    batch_size: int = 1
    grad_accum: int = 1
    grad_checkpointing: bool = False
    precision: str = "auto"
    seed: int = 0
    save_every: int = 0
    resume_from: str | None = None
    merge: bool = False
    log_dir: str | None = None
    eval_lengths: list[int] | None = None
    eval_rows: int = 4  # documents per evaluation length
    passkey_depths: int = 0  # passkey needle depths per evaluation length (0: no passkey)
    eval_far_context: bool = False  # far-context loss and ratio at every evaluation length >= L0


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


def plan_stages(cfg: FinetuneConfig, original: int) -> list[Stage]:
    """The (span, window, steps) stages of the run; ValueError for lengths or steps that do not add up."""
    pairs = cfg.stages or [(cfg.length, cfg.max_steps or 0)]
    total = sum(steps for _, steps in pairs)
    if cfg.max_steps is not None and cfg.max_steps != total or total < 1:
        raise ValueError(f"--max-steps {cfg.max_steps} must be >= 1 and equal the sum of --stages steps ({total})")
    if any(span > cfg.length for span, _ in pairs):
        raise ValueError(f"--stages {pairs}: every stage length must be <= --length {cfg.length}")
    if cfg.window is not None and (cfg.position_schedule == "contiguous" or not 2 <= cfg.window <= cfg.length):
        raise ValueError(
            f"--window {cfg.window}: only for position schedules pose/random, and within [2, --length {cfg.length}]"
        )
    stages = []  # a stage shorter than the window trains its own length in full
    for span, steps in pairs:
        window = span if cfg.position_schedule == "contiguous" else min(cfg.window or original, span)
        check_schedule(cfg.position_schedule, window, span, cfg.pose_chunks)
        stages.append(Stage(span=span, window=window, steps=steps))
    return stages


POSITIVE = ("length", "batch_size", "grad_accum", "rank", "eval_rows", "pose_chunks")  # integers >= 1
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
    if any(int(n) < 2 for n in cfg.eval_lengths or ()):
        raise ValueError(f"eval_lengths={cfg.eval_lengths!r}: every length must be an integer >= 2")


def check_output(cfg: FinetuneConfig) -> Path:
    """The output folder must not exist, except when resuming into it before it holds a finished adapter."""
    out = Path(cfg.out)
    if out.exists() and not cfg.resume_from:
        raise FileExistsError(f"--out {str(out)!r} exists; choose a new folder (nothing was written)")
    if out.exists() and (out / "adapter_config.json").exists():
        raise FileExistsError(f"--out {str(out)!r} already holds a finished adapter; choose a new folder")
    if cfg.resume_from and not Path(cfg.resume_from).is_dir():
        raise FileNotFoundError(f"--resume-from {cfg.resume_from!r}: no such checkpoint folder")
    if cfg.resume_from:
        check_folder(cfg.resume_from)  # optimizer, scheduler, RNG and adapter states, before the model loads
    if cfg.log_dir and (Path(cfg.log_dir) / LOG_FILE).exists() and not cfg.resume_from:
        raise FileExistsError(f"--log-dir {cfg.log_dir!r} already holds a {LOG_FILE}; choose a new folder")
    check_free(out, cfg.resume_from)
    return out


def settings_of(cfg: FinetuneConfig) -> LoopSettings:
    return LoopSettings(
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        scheduler=cfg.scheduler,
        weight_decay=cfg.weight_decay,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        schedule=cfg.position_schedule,
        pose_chunks=cfg.pose_chunks,
        seed=cfg.seed,
        save_every=cfg.save_every,
    )


def training_summary(cfg: FinetuneConfig) -> dict:
    """Hyperparameters for the model card (no paths)."""
    keep = {
        k: v for k, v in asdict(cfg).items() if k not in ("model", "out", "data", "eval_data", "resume_from", "log_dir")
    }
    return {k: (json.dumps(v) if isinstance(v, (list, tuple, dict)) else v) for k, v in keep.items() if v is not None}
