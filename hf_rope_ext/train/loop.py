"""The training loop on accelerate's engine: stages of (position span, window, steps), gradient accumulation,
an LR schedule, checkpoints that resume exactly (``checkpoints``; ``batches``: batch order is a permutation drawn
from (seed, stage, epoch); position ids from (seed, micro-batch index)), a progress bar (``progress``) and a CSV log
(TensorBoard when installed).

Many processes (DDP, FSDP): the loader yields *global* micro-batches of ``batch_size x data-parallel processes`` rows
and accelerate hands each process its slice (``split_batches``); position ids are drawn for the whole global
micro-batch and sliced the same way. So N processes train on exactly the rows and positions one process sees with an
N times larger batch, and the result does not depend on the process count beyond float summation order. Under
sequence parallelism (``sequence_parallel``) the ranks of a sequence group read the same rows and each keeps its shard
of every row's tokens.

Ctrl-C (SIGINT) during training stops after the current optimizer step on every process, writes a checkpoint there
and raises ``interrupt.Interrupted`` (a ``KeyboardInterrupt``) naming it; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..util.progress import bar as progress_bar
from .batches import data_parallel, micro_batches, stage_loaders
from .checkpoints import keep_trainable_only, load_checkpoint, save_checkpoint
from .context_parallel import IGNORE_INDEX, shifted_labels
from .csv_log import CsvLog
from .deepspeed_config import fill_deepspeed_config
from .head_loss import summed_loss
from .interrupt import Interrupted, StopRequest
from .positions import position_ids, step_generator
from .sequence_parallel import ONE, SequenceGroup, enable, shard_loss


@dataclass(frozen=True)
class Stage:
    span: int  # positions lie in [0, span): the length this stage teaches
    window: int  # tokens per training sequence (== span for the contiguous schedule)
    steps: int  # optimizer steps


@dataclass(frozen=True)
class LoopSettings:
    """What the loop needs of a ``FinetuneConfig`` (whose fields hold the defaults; see ``plan.settings_of``)."""

    lr: float
    warmup_steps: int
    scheduler: str
    weight_decay: float
    batch_size: int
    grad_accum: int
    schedule: str
    pose_chunks: int
    seed: int
    save_every: int  # checkpoint every N optimizer steps (0: only at the end)
    max_grad_norm: float = 1.0
    sequence_parallel: int = 1  # processes each row's tokens are split over (sequence_parallel.py)

    def plan(self, stages: list[Stage], processes: int) -> dict:
        """What a checkpoint must agree with to be resumed (``processes``: data-parallel processes, one RNG each)."""
        keep = ("batch_size", "grad_accum", "schedule", "pose_chunks", "seed", "scheduler", "warmup_steps", "lr")
        keep += ("sequence_parallel",)
        return {"stages": [asdict(s) for s in stages], "processes": processes, **{k: getattr(self, k) for k in keep}}


def make_optimizer(model, settings: LoopSettings, total_steps: int):
    """AdamW on the trainable parameters and transformers' LR schedule in optimizer steps (with ``split_batches``
    accelerate steps the scheduler once per optimizer step, whatever the process count)."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = get_scheduler(
        settings.scheduler, optimizer, num_warmup_steps=settings.warmup_steps, num_training_steps=total_steps
    )
    return optimizer, scheduler


def forward_loss(
    accelerator, model, input_ids: torch.Tensor, positions: torch.Tensor, labels=None, sequence: SequenceGroup = ONE
) -> torch.Tensor:
    """Mean loss of one micro-batch over the tokens ``labels`` (batch, seq) scores (-100: not scored; default: every
    token), its logits never formed whole (``head_loss``); an all-ones mask keeps transformers from reading skip-wise
    ids as packed sequences. Under sequence parallelism the rows are whole on every rank of the group, which keeps
    and scores its shard (``sequence_parallel.shard_loss``)."""
    labels = shifted_labels(input_ids if labels is None else labels)  # on the whole row, before any sharding
    cp = accelerator.parallelism_config is not None and accelerator.parallelism_config.cp_enabled
    if cp:  # context parallelism shards every buffer along the sequence (see context_parallel.py)
        with accelerator.maybe_context_parallel(buffers=[input_ids, positions, labels], buffer_seq_dims=[1, 1, 1]):
            logits = model(input_ids=input_ids, position_ids=positions).logits
            return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    input_ids, positions, labels = (sequence.shard(t) for t in (input_ids, positions, labels))
    inputs = dict(input_ids=input_ids, position_ids=positions, attention_mask=torch.ones_like(input_ids))
    total = summed_loss(model, accelerator.unwrap_model(model), labels, **inputs)
    return shard_loss(total, labels, sequence)


def stage_of(stages: list[Stage], step: int) -> tuple[int, int]:
    """(stage index, steps already done inside it) for a global optimizer step count < total."""
    ends = torch.tensor([s.steps for s in stages]).cumsum(0)
    index = int((ends <= step).sum())
    return index, step - (int(ends[index - 1]) if index else 0)


@dataclass
class Run:
    """Everything one training run carries between its steps."""

    accelerator: object
    model: object
    optimizer: object
    scheduler: object
    loaders: list
    stages: list[Stage]
    settings: LoopSettings
    plan: dict
    checkpoint_dir: Path
    log: CsvLog
    bar: object
    started: float
    total: int
    stop: StopRequest
    saved_step: int = -1  # the step of the last checkpoint written
    sequence: SequenceGroup = ONE  # this process' sequence group


def train(
    accelerator,
    model,
    stages: list[Stage],
    datasets,
    settings: LoopSettings,
    checkpoint_dir: Path,
    log_dir: Path,
    resume_from: str | None = None,
    sequence: SequenceGroup = ONE,
    prepared=None,
) -> list[dict]:
    """Run every stage; returns (the log rows of this call, the accelerate-prepared model).
    ``datasets[i]`` holds rows of ``stages[i].window`` tokens; ``sequence``: this process' sequence group (its size
    ``settings.sequence_parallel``); ``prepared``: called with the prepared model before a checkpoint is read or a
    step taken. Ctrl-C: see :class:`Interrupted`."""
    sp = settings.sequence_parallel
    total, plan = sum(s.steps for s in stages), settings.plan(stages, data_parallel(accelerator, sp)[0])
    optimizer, scheduler = make_optimizer(model, settings, total)
    fill_deepspeed_config(accelerator, model, settings.batch_size)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.register_save_state_pre_hook(keep_trainable_only)
    if prepared is not None:
        prepared(model)
    loaders = stage_loaders(accelerator, datasets, settings.batch_size, settings.seed, sp)
    step = load_checkpoint(accelerator, resume_from, plan) if resume_from else 0
    bar = progress_bar(
        total=total, initial=step, desc="fine-tuning", nested=False, enabled=accelerator.is_local_main_process
    )
    log = CsvLog(log_dir, accelerator.is_main_process, step)
    run = Run(
        accelerator=accelerator,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loaders=loaders,
        stages=stages,
        settings=settings,
        plan=plan,
        checkpoint_dir=Path(checkpoint_dir),
        log=log,
        bar=bar,
        started=time.perf_counter(),
        total=total,
        stop=StopRequest(announce=accelerator.is_main_process),
        saved_step=step if resume_from else -1,
        sequence=sequence,
    )
    model.train()
    rows: list[dict] = []
    disable = enable(accelerator.unwrap_model(model), sequence)
    try:
        with run.stop, bar:
            while step < total:
                step = run_stage(run, step, rows)
            stop_if_asked(run, step)
    finally:
        disable()
    return rows, model


def run_stage(run: Run, step: int, rows: list[dict]) -> int:
    """Train from optimizer step ``step`` to the end of its stage; returns the step reached."""
    index, done = stage_of(run.stages, step)
    stage, accum = run.stages[index], run.settings.grad_accum
    first_micro = (step - done) * accum  # micro-batches before this stage, for the position seeds
    for micro, batch in enumerate(micro_batches(run.accelerator, run.loaders[index], done * accum), start=done * accum):
        loss = micro_step(run, stage, batch["input_ids"], first_micro + micro, batch.get("labels"))
        if not run.accelerator.sync_gradients:
            continue
        step += 1
        rows.append(after_step(run, step, index, loss))
        if step >= run.total or stage_of(run.stages, step)[0] != index:
            return step
    return step


def micro_step(run: Run, stage: Stage, input_ids: torch.Tensor, global_micro: int, labels=None) -> torch.Tensor:
    """Forward and backward of one micro-batch (this process' rows of global micro-batch ``global_micro``, scored
    where ``labels`` says, default every token); the optimizer steps when accumulation is complete."""
    acc, settings = run.accelerator, run.settings
    processes, rank = data_parallel(acc, settings.sequence_parallel)
    rows = input_ids.shape[0]  # the global micro-batch is groups' rows in rank order: ours are [rank*rows, +rows)
    every = position_ids(
        settings.schedule,
        rows * processes,
        stage.window,
        stage.span,
        step_generator(settings.seed, global_micro),
        settings.pose_chunks,
    )
    positions = every[rank * rows : (rank + 1) * rows].to(acc.device)
    with acc.accumulate(run.model):
        loss = forward_loss(acc, run.model, input_ids, positions, labels, run.sequence)
        acc.backward(loss)
        if acc.sync_gradients and settings.max_grad_norm:
            acc.clip_grad_norm_(run.model.parameters(), settings.max_grad_norm)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad()
    return loss.detach()


def after_step(run: Run, step: int, index: int, loss: torch.Tensor) -> dict:
    """Log the optimizer step (CSV, trackers, bar), write a checkpoint when one is due, and stop on Ctrl-C."""
    acc, every = run.accelerator, run.settings.save_every
    # one collective per step: every process' loss and stop request, so that all processes stop at the same step
    asked = torch.tensor(float(run.stop.asked), device=loss.device)
    shared = acc.gather(torch.stack([loss.float(), asked])).reshape(-1, 2)  # (processes, [loss, asked])
    row = log_row(run, step, index, float(shared[:, 0].mean()))
    run.log.write(row)
    acc.log({"loss": row["loss"], "lr": row["lr"]}, step=step)
    run.bar.update(1)
    run.bar.set_postfix(loss=f"{row['loss']:.4f}", stage=index)
    stop = bool(shared[:, 1].any())
    if (every and step % every == 0) or step == run.total or stop:
        checkpoint(run, step)
    if stop:
        raise Interrupted(step, run.checkpoint_dir / f"step-{step:06d}")
    return row


def stop_if_asked(run: Run, step: int) -> None:
    """A Ctrl-C that came during the last step, after its check (while its checkpoint was written): the run stops
    there too, with that checkpoint, rather than going on to evaluate and save as if nobody had asked."""
    asked = torch.tensor([float(run.stop.asked)], device=run.accelerator.device)
    if bool(run.accelerator.gather(asked).any()):
        checkpoint(run, step)
        raise Interrupted(step, run.checkpoint_dir / f"step-{step:06d}")


def log_row(run: Run, step: int, index: int, loss: float) -> dict:
    """One row of the CSV log; ``tokens``: of this optimizer step over all data-parallel processes."""
    stage, settings = run.stages[index], run.settings
    sp = settings.sequence_parallel
    return {
        "step": step,
        "stage": index,
        "span": stage.span,
        "window": stage.window,
        "loss": loss,
        "lr": run.scheduler.get_last_lr()[0],
        "tokens": settings.batch_size * settings.grad_accum * stage.window * data_parallel(run.accelerator, sp)[0],
        "elapsed_s": round(time.perf_counter() - run.started, 3),
    }


def checkpoint(run: Run, step: int) -> None:
    """Write the checkpoint of ``step`` unless it was just written (a save step on which Ctrl-C also asked)."""
    if run.saved_step != step:
        save_checkpoint(run.accelerator, run.checkpoint_dir / f"step-{step:06d}", step, run.plan)
        run.saved_step = step
