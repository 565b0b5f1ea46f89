"""What the loop runs for a fine-tuning request: its stages (span, window, steps), checked against the request's
lengths and position schedule, and the settings the loop reads (:class:`~hf_rope_ext.train.loop.LoopSettings`)."""

from __future__ import annotations

from .config import FinetuneConfig
from .loop import LoopSettings, Stage
from .positions import check_schedule


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
        sequence_parallel=cfg.sequence_parallel,
    )
