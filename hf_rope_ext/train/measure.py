"""Fine-tuning's before and after figures (``--eval-lengths``): the evaluation harness on the run's model, perplexity
and last-chunk loss, the teacher-forced passkey when asked, the far-context ratio against the base model read through
a sliding window. On several processes each row is read through the training forward, split as training splits it
(``split_reading``), so a row trained over N processes is evaluated on them; on one, the evaluation's own reading."""

from __future__ import annotations

import torch

from ..eval import EvalPlan, evaluate_model
from ..eval.far_context import sliding_window_baseline, with_far_context
from ..eval.perplexity import CachedLosses
from .loading import shards_at_load, whole_weights
from .split_reading import SplitReader


def measure(job, label: str, model, prepared=None) -> list[dict]:
    """Records at each of ``job.cfg.eval_lengths`` for ``model``, each marked ``when``: ``label``. ``prepared``: the
    model as accelerate prepared it (a DeepSpeed engine gathers its partitioned weights in its own forward only),
    which a run on several processes calls."""
    cfg, params = job.cfg, job.config.rope_parameters
    if not cfg.eval_lengths:
        return []
    plan = EvalPlan(
        lengths=tuple(cfg.eval_lengths),
        documents=cfg.eval_rows,
        last_chunk=128 if min(cfg.eval_lengths) > 128 else None,
        passkey_depths=cfg.passkey_depths,
        generate=False,
        seed=cfg.seed,
    )
    reader = SplitReader(job.sequence, prepared) if job.accelerator.num_processes > 1 else None
    losses, was_training = CachedLosses(reader and reader.losses), model.training
    records = evaluate_model(
        model.eval(),
        job.tokenizer,
        job.eval_documents,
        plan,
        params["rope_type"],
        params.get("factor"),
        progress=job.accelerator.is_local_main_process,
        losses=losses,
        predict=reader and reader.predictions,
    )
    if cfg.eval_far_context:
        records = far_context(job, model, records, losses)
    model.train(was_training)
    resharded(model)
    return [{**r, "when": label} for r in records]


def resharded(model) -> None:
    """FSDP2 leaves the parameters of modules it does not reshard after forward (the root) gathered after a forward
    without backward; sharded again, they are the objects the optimizer and the checkpoint loader hold."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def far_context(job, model, records: list[dict], losses) -> list[dict]:
    """The records at lengths >= L0 with the far-context loss on the last L0 - 1 tokens of the longest length and its
    ratio to the base model (rope as saved) reading them through a sliding L0 window (measured once a job, by the
    main process alone: the others never load that model; on its device, or, where the run shards its weights as it
    loads them (``baseline_device``), in its host memory)."""
    from accelerate.utils import broadcast_object_list
    from transformers import AutoModelForCausalLM

    cfg, total = job.cfg, max(job.cfg.eval_lengths)
    docs, l0 = job.eval_documents, job.pretrain
    if job.far_baseline is None:  # read by the main process alone; its figure sent to the others
        acc, found = job.accelerator, [None]
        if acc.is_main_process:
            with whole_weights(acc):
                base = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).to(baseline_device(acc))
            found = [sliding_window_baseline(base, docs, total, l0, l0 - 1, cfg.eval_rows)]
            del base
        job.far_baseline = broadcast_object_list(found)[0] if acc.num_processes > 1 else found[0]
    short = [r for r in records if r["length"] < l0]
    far = [r for r in records if r["length"] >= l0]
    return short + with_far_context(model, far, docs, total, l0, job.far_baseline, cfg.eval_rows, False, losses)


def baseline_device(accelerator) -> torch.device:
    """Where the far-context baseline runs: the main process's device, except on a run that never holds the whole
    model on a device (FSDP2 reading once, ZeRO-3 partitioning as it loads: ``train.loading``), where it runs in host
    memory, on the CPU."""
    return torch.device("cpu") if shards_at_load(accelerator) else accelerator.device
