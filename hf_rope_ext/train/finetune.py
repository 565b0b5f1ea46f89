"""Long-context LoRA fine-tuning, end to end: check the request, load the base with the target rope parameters,
pack the data per stage, measure, train on accelerate, measure again, save adapter + config + tokenizer + card
(and a merged model on request).

Every check runs before the first training step, and the output folder is created only once they all pass.
"""

from __future__ import annotations

from pathlib import Path

from .checkpoints import check_checkpoint_tensors, checkpoint_step
from .config import FinetuneConfig, check_numbers, check_output, training_summary
from .loop import data_parallel, train
from .prepare import prepare_run


def finetune(cfg: FinetuneConfig) -> dict:
    """Run the whole job; returns {'out', 'log', 'results', 'rows', 'merged'} (rows: the training log of this call)."""
    check_numbers(cfg)
    out = check_output(cfg)
    job = prepare_run(cfg)
    model = ready_to_train(job)
    log_dir = open_output(job, out)
    rows, model = train(
        job.accelerator, model, job.stages, job.datasets, job.settings, out / "checkpoints", log_dir, cfg.resume_from
    )
    job.measure("after", job.accelerator.unwrap_model(model))
    result = job.save(out, model, rows, log_dir)
    job.accelerator.end_training()  # closes the trackers (and the process group): last
    return result


def ready_to_train(job):
    """The 'before' figures, then the LoRA model; a checkpoint to resume must fit both the plan and the adapter."""
    cfg = job.cfg
    if cfg.resume_from:
        processes = data_parallel(job.accelerator)[0]
        checkpoint_step(cfg.resume_from, job.settings.plan(job.stages, processes))
    job.measure("before")
    model = job.attach_lora()
    if cfg.resume_from:
        check_checkpoint_tensors(model, cfg.resume_from)
    return model


def open_output(job, out: Path) -> Path:
    """Create the output folder (main process, once every process has passed its checks); returns the log folder."""
    acc, cfg = job.accelerator, job.cfg
    acc.wait_for_everyone()
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=bool(cfg.resume_from))
    acc.wait_for_everyone()
    if acc.log_with:  # TensorBoard, when installed
        acc.init_trackers("finetune", config=training_summary(cfg))
    return Path(cfg.log_dir) if cfg.log_dir else out / "logs"
