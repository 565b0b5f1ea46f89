"""The training loop on accelerate's engine: stages of (position span, window, steps), gradient accumulation,
an LR schedule, checkpoints that resume exactly, a tqdm bar and a CSV log (TensorBoard too when installed).

Exact resume: ``accelerator.save_state`` keeps the trainable weights, optimizer, scheduler and RNG states; the
checkpoint's ``trainer_state.json`` keeps the optimizer step. Batch order is a permutation drawn from
(seed, stage, epoch) and position ids from (seed, micro-batch index), so a resumed run sees the same batches.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .positions import position_ids, step_generator

STATE_FILE = "trainer_state.json"
LOG_FILE = "train_log.csv"
LOG_COLUMNS = ("step", "stage", "span", "window", "loss", "lr", "tokens", "elapsed_s")  # tokens: of this step


@dataclass(frozen=True)
class Stage:
    span: int  # positions lie in [0, span): the length this stage teaches
    window: int  # tokens per training sequence (== span for the contiguous schedule)
    steps: int  # optimizer steps


@dataclass(frozen=True)
class LoopSettings:
    """What the loop needs of a ``FinetuneConfig`` (whose fields hold the defaults; see ``finetune.settings_of``)."""

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

    def plan(self, stages: list[Stage]) -> dict:
        """What a checkpoint must agree with to be resumed."""
        keep = ("batch_size", "grad_accum", "schedule", "pose_chunks", "seed", "scheduler", "warmup_steps", "lr")
        return {"stages": [asdict(s) for s in stages], **{k: getattr(self, k) for k in keep}}


class EpochSampler(torch.utils.data.Sampler):
    """A permutation of [0, n) that depends on (seed, epoch) only: identical on every process and after a resume."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (batch, seq, vocab), ids (batch, seq); fp32 softmax."""
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), input_ids[:, 1:].flatten())


def make_optimizer(model, settings: LoopSettings, total_steps: int, processes: int):
    """AdamW on the trainable parameters and transformers' LR schedule (counted per process, as accelerate steps it)."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = get_scheduler(
        settings.scheduler,
        optimizer,
        num_warmup_steps=settings.warmup_steps * processes,
        num_training_steps=total_steps * processes,
    )
    return optimizer, scheduler


def keep_trainable_only(models, weights, _output_dir) -> None:
    """save_state pre-hook: write only trainable tensors (the adapter), not the frozen base."""
    for i, model in enumerate(models):
        names = {n for n, p in model.named_parameters() if p.requires_grad}
        weights[i] = {k: v for k, v in weights[i].items() if k in names}


def stage_loaders(accelerator, datasets, settings: LoopSettings):
    """One prepared DataLoader per stage (batches of ``input_ids``, full batches only)."""
    loaders = []
    for index, dataset in enumerate(datasets):
        rows = dataset.with_format("torch", columns=["input_ids"])
        sampler = EpochSampler(len(rows), settings.seed * 131 + index)
        # its own generator: starting an epoch must not draw from the global RNG (dropout), or resume would drift
        own = torch.Generator().manual_seed(settings.seed)
        loader = torch.utils.data.DataLoader(
            rows, batch_size=settings.batch_size, sampler=sampler, drop_last=True, generator=own
        )
        loaders.append(accelerator.prepare(loader))
    return loaders


def micro_batches(accelerator, loader, start: int):
    """Micro-batches of one stage from micro-batch index ``start`` on, epoch after epoch (never ends)."""
    per_epoch = len(loader)
    epoch, skip = divmod(start, per_epoch)
    while True:
        loader.set_epoch(epoch)
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        epoch, skip = epoch + 1, 0


def forward_loss(accelerator, model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Loss of one micro-batch; an all-ones mask keeps transformers from reading skip-wise ids as packed sequences."""
    cp = accelerator.parallelism_config is not None and accelerator.parallelism_config.cp_enabled
    if cp:  # context parallelism shards every buffer along the sequence; the loss needs labels shifted beforehand
        labels = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], -100)], dim=1)
        with accelerator.maybe_context_parallel(buffers=[input_ids, positions, labels], buffer_seq_dims=[1, 1, 1]):
            logits = model(input_ids=input_ids, position_ids=positions).logits
            return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
    mask = torch.ones_like(input_ids)
    return causal_lm_loss(model(input_ids=input_ids, position_ids=positions, attention_mask=mask).logits, input_ids)


def save_checkpoint(accelerator, directory: Path, step: int, plan: dict) -> Path:
    accelerator.save_state(str(directory))
    if accelerator.is_main_process:
        (directory / STATE_FILE).write_text(json.dumps({"step": step, "plan": plan}, indent=2), encoding="utf-8")
    accelerator.wait_for_everyone()
    return directory


def load_checkpoint(accelerator, directory: Path, plan: dict) -> int:
    """Restore a checkpoint written with the same plan; returns the optimizer steps already done."""
    step = checkpoint_step(directory, plan)
    accelerator.load_state(str(directory), strict=False)  # only trainable tensors are in the checkpoint
    return step


def check_checkpoint_tensors(model, directory: Path) -> None:
    """Every trainable tensor of the (unwrapped) model must be in the checkpoint, since load_state runs non-strict.
    FSDP and DeepSpeed checkpoints keep their tensors elsewhere and are not checked here."""
    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        return
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as handle:
        saved = set(handle.keys())
    missing = sorted(n for n, p in model.named_parameters() if p.requires_grad and n not in saved)
    if missing:
        raise ValueError(f"--resume-from: {weights} lacks trainable tensor {missing[0]!r} ({len(missing)} missing)")


def checkpoint_step(directory: Path, plan: dict) -> int:
    """The optimizer step a checkpoint was written at; ValueError when it was written under another plan."""
    state_path = Path(directory) / STATE_FILE
    if not state_path.is_file():
        raise FileNotFoundError(f"--resume-from {str(directory)!r}: no {STATE_FILE} (not a checkpoint of this trainer)")
    state = json.loads(state_path.read_text(encoding="utf-8"))
    differs = sorted(k for k in plan if state["plan"].get(k) != plan[k])
    if differs:
        key = differs[0]
        raise ValueError(f"--resume-from: the checkpoint has {key}={state['plan'].get(key)!r}, this run {plan[key]!r}")
    return int(state["step"])


class CsvLog:
    """Appends one row per optimizer step to ``log_dir/train_log.csv`` (main process only)."""

    def __init__(self, log_dir: Path, enabled: bool):
        self.path = Path(log_dir) / LOG_FILE
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                self.path.write_text(",".join(LOG_COLUMNS) + "\n", encoding="utf-8")

    def write(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a", newline="", encoding="utf-8") as handle:
                csv.DictWriter(handle, LOG_COLUMNS).writerow(row)


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


def train(
    accelerator,
    model,
    stages: list[Stage],
    datasets,
    settings: LoopSettings,
    checkpoint_dir: Path,
    log_dir: Path,
    resume_from: str | None = None,
) -> list[dict]:
    """Run every stage; returns (the log rows of this call, the accelerate-prepared model).
    ``datasets[i]`` holds rows of ``stages[i].window`` tokens."""
    from tqdm.auto import tqdm

    total, plan = sum(s.steps for s in stages), settings.plan(stages)
    optimizer, scheduler = make_optimizer(model, settings, total, accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.register_save_state_pre_hook(keep_trainable_only)
    loaders = stage_loaders(accelerator, datasets, settings)
    step = load_checkpoint(accelerator, resume_from, plan) if resume_from else 0
    bar = tqdm(total=total, initial=step, desc="fine-tuning", disable=not accelerator.is_local_main_process)
    run = Run(
        accelerator,
        model,
        optimizer,
        scheduler,
        loaders,
        stages,
        settings,
        plan,
        Path(checkpoint_dir),
        CsvLog(log_dir, accelerator.is_main_process),
        bar,
        time.perf_counter(),
        total,
    )
    model.train()
    rows: list[dict] = []
    while step < total:
        step = run_stage(run, step, rows)
    bar.close()
    return rows, model


def run_stage(run: Run, step: int, rows: list[dict]) -> int:
    """Train from optimizer step ``step`` to the end of its stage; returns the step reached."""
    index, done = stage_of(run.stages, step)
    stage, accum = run.stages[index], run.settings.grad_accum
    first_micro = (step - done) * accum  # micro-batches before this stage, for the position seeds
    for micro, batch in enumerate(micro_batches(run.accelerator, run.loaders[index], done * accum), start=done * accum):
        loss = micro_step(run, stage, batch["input_ids"], first_micro + micro)
        if not run.accelerator.sync_gradients:
            continue
        step += 1
        rows.append(after_step(run, step, index, loss))
        if step >= run.total or stage_of(run.stages, step)[0] != index:
            return step
    return step


def micro_step(run: Run, stage: Stage, input_ids: torch.Tensor, global_micro: int) -> torch.Tensor:
    """Forward and backward of one micro-batch; the optimizer steps when accumulation is complete."""
    acc, settings = run.accelerator, run.settings
    generator = step_generator(settings.seed, global_micro * acc.num_processes + acc.process_index)
    positions = position_ids(
        settings.schedule, input_ids.shape[0], stage.window, stage.span, generator, settings.pose_chunks
    ).to(acc.device)
    with acc.accumulate(run.model):
        loss = forward_loss(acc, run.model, input_ids, positions)
        acc.backward(loss)
        if acc.sync_gradients and settings.max_grad_norm:
            acc.clip_grad_norm_(run.model.parameters(), settings.max_grad_norm)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad()
    return loss.detach()


def after_step(run: Run, step: int, index: int, loss: torch.Tensor) -> dict:
    """Log the optimizer step (CSV, trackers, bar) and write a checkpoint when one is due."""
    stage, settings, acc = run.stages[index], run.settings, run.accelerator
    row = {
        "step": step,
        "stage": index,
        "span": stage.span,
        "window": stage.window,
        "loss": float(acc.gather(loss).mean()),
        "lr": run.scheduler.get_last_lr()[0],
        "tokens": settings.batch_size * settings.grad_accum * stage.window * acc.num_processes,
        "elapsed_s": round(time.perf_counter() - run.started, 3),
    }
    run.log.write(row)
    acc.log({"loss": row["loss"], "lr": row["lr"]}, step=step)
    run.bar.update(1)
    run.bar.set_postfix(loss=f"{row['loss']:.4f}", stage=index)
    if (settings.save_every and step % settings.save_every == 0) or step == run.total:
        save_checkpoint(acc, run.checkpoint_dir / f"step-{step:06d}", step, run.plan)
    return row
