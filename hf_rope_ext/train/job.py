"""Long-context LoRA fine-tuning, end to end: check the request, load the base with the target rope parameters,
pack the data per stage, measure, train on accelerate, measure again, save adapter + config + tokenizer + card
(and a merged model on request).

Every check runs before the first training step, and the output folder is created only once they all pass.
"""

from __future__ import annotations

from pathlib import Path

from .batches import data_parallel
from .checkpoints import check_checkpoint_tensors, checkpoint_step
from .config import MERGED_DIR, FinetuneConfig, check_numbers, check_output, training_summary
from .loop import train
from .measure import resharded
from .model import check_fp16
from .prepare import prepare_run
from .run_folder import log_dir, run_folder


def finetune(cfg: FinetuneConfig) -> dict:
    """Run the whole job; returns {'out', 'log', 'results', 'rows', 'merged'} (rows: the training log of this call)."""
    check_numbers(cfg)
    out = check_output(cfg)
    job = prepare_run(cfg)
    with run_folder(job.accelerator, out, cfg.resume_from, cfg.log_dir) as work:  # see train.run_folder
        model = ready_to_train(job)
        logs = open_output(job, work)
        acc = job.accelerator
        checkpoints = work / "checkpoints"
        parts = (job.stages, job.datasets, job.settings, checkpoints, logs, cfg.resume_from, job.sequence)
        rows, model = train(acc, model, *parts, prepared=on_prepared(job))
        job.measure("after", acc.unwrap_model(model), model)
        job.save(work, model, out)
    job.accelerator.end_training()  # closes the trackers (and the process group): last
    merged = str(out / MERGED_DIR) if cfg.merge else None
    logs = log_dir(out, None, cfg.log_dir)
    return {"out": str(out), "log": str(logs), "results": job.results, "rows": rows, "merged": merged}


def ready_to_train(job):
    """The 'before' figures (one process; see ``on_prepared``), then the LoRA model; a checkpoint to resume must
    fit both the plan and the adapter."""
    cfg = job.cfg
    if cfg.resume_from:
        processes = data_parallel(job.accelerator, cfg.sequence_parallel)[0]
        checkpoint_step(cfg.resume_from, job.settings.plan(job.stages, processes))
    if job.accelerator.num_processes == 1:
        job.measure("before")
    model = job.attach_lora()
    if cfg.resume_from:
        check_checkpoint_tensors(model, cfg.resume_from)
    return model


def on_prepared(job):
    """What runs on the prepared model before a checkpoint is read, on several processes: the fp16 range check of a
    run that reads its base once (``train.loading``: until prepared, the other processes hold no weights), then the
    'before' figures, adapter at its start (LoRA B = 0 adds exact zeros). FSDP2 shards and ZeRO-3 partitions hold the
    weights only once prepared, and every split reading needs the whole group."""
    acc = job.accelerator
    if acc.num_processes == 1:
        return None

    def run(model):
        if job.fp16_row is not None:
            check_fp16(model, job.fp16_row)
            resharded(model)
        job.measure("before", acc.unwrap_model(model), model)

    return run


def open_output(job, work: Path) -> Path:
    """Create the folder the run writes into (main process, once every process has passed its checks); returns the
    log folder."""
    acc, cfg = job.accelerator, job.cfg
    acc.wait_for_everyone()
    if acc.is_main_process:
        work.mkdir(parents=True, exist_ok=bool(cfg.resume_from))
    acc.wait_for_everyone()
    if acc.log_with:  # TensorBoard, when installed
        acc.init_trackers("finetune", config=training_summary(cfg))
    return log_dir(cfg.out, cfg.resume_from, cfg.log_dir)
