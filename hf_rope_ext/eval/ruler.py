"""lm-eval's RULER tasks on a model built with any rope type: lm-eval's own data builders, prompts, generation
settings and scoring, through its ``HFLM`` wrapped around the model the package loaded.

One ``simple_evaluate`` per length, so that ``limit`` is per length (lm-eval's ``--limit`` takes the first N documents
of a task, and a task made for several lengths lists every sample of the first length first) and so that lm-eval's
truncation is the length itself: HFLM left-truncates a prompt to ``max_length`` minus the generated tokens, and reads
``max_length`` from ``max_position_embeddings`` when not given, which for a model loaded with a rope type is still
the pretraining length (``eval.loading``). lm-eval's builders make 500 samples per length whatever ``limit`` is;
``limit`` only bounds how many are read.

A record: ``{"rope_type", "factor", "length", "task", "ruler_score", "samples", "answers"}``: the score lm-eval
reports for that length (the mean over samples of the share of expected values found in the answer, 0-1), the number
of samples it read and each sample's expected values and generated answer; where every sample asks one value, also
``n``, ``hits`` and their Wilson 95% ``interval``.
"""

from __future__ import annotations

from . import ruler_fit, ruler_tasks
from .intervals import score

DEFAULT_SAMPLES = 500  # what lm-eval's builders make per length (and read, without a limit)


def lm_for(model, tokenizer, length: int, batch_size: int = 1):
    """lm-eval's HFLM around a loaded model, reading at most ``length`` tokens (prompt plus generated ones)."""
    from lm_eval.models.huggingface import HFLM

    device = str(model.device)
    return HFLM(pretrained=model, tokenizer=tokenizer, max_length=int(length), batch_size=batch_size, device=device)


def run_tasks(lm, tasks, length: int, tokenizer_path, limit=None, max_gen_toks=None, chat_template=False) -> list[dict]:
    """``tasks`` (lm-eval names) at one ``length`` through ``lm``; one record per task (without rope_type/factor).
    ``tokenizer_path``: the folder lm-eval's builders load the tokenizer from to size the samples; ``max_gen_toks``:
    None keeps each task's own (128 for the needle tasks), a number cuts generation shorter (tests);
    ``chat_template``: each prompt put in the tokenizer's chat template as a user turn (lm-eval's
    ``apply_chat_template``), as an instruct model was trained to read its input."""
    import lm_eval

    ruler_tasks.import_builders(tasks)
    gen_kwargs = None if max_gen_toks is None else {"max_gen_toks": int(max_gen_toks)}
    metadata = {"max_seq_lengths": [int(length)], "tokenizer": str(tokenizer_path)}
    results = lm_eval.simple_evaluate(
        lm,
        tasks=list(tasks),
        limit=limit,
        task_manager=task_manager(metadata),
        log_samples=True,
        bootstrap_iters=0,
        gen_kwargs=gen_kwargs,
        apply_chat_template=bool(chat_template),
    )
    return [{**record(task, length, results), "chat_template": bool(chat_template)} for task in tasks]


def task_manager(metadata: dict):
    """lm-eval's TaskManager over its RULER folder only: the same task configs, without indexing the other
    thousands of lm-eval's tasks for every length."""
    from pathlib import Path

    from lm_eval.tasks import TaskManager
    from lm_eval.tasks.ruler import niah_utils

    folder = Path(niah_utils.__file__).parent
    return TaskManager(include_path=str(folder), include_defaults=False, metadata=metadata)


def record(task: str, length: int, results: dict) -> dict:
    """The score lm-eval computed for ``task`` at ``length``, with the samples it read."""
    key = f"{length},none"
    scores = results["results"][task]
    if key not in scores:
        raise RuntimeError(f"lm-eval reported no score for {task} at {length} tokens: {sorted(scores)}")
    samples = results["samples"][task]
    answers = [{"expected": list(s["doc"]["outputs"]), "answer": first(s["filtered_resps"])} for s in samples]
    found = {"task": task, "length": int(length), "ruler_score": float(scores[key]), "samples": len(samples)}
    return found | counted(found["ruler_score"], answers) | {"answers": answers}


def counted(mean: float, answers: list[dict]) -> dict:
    """``n``, ``hits`` and the Wilson ``interval`` where every sample asks one value (each scores 0 or 1, so the
    mean is hits / n); nothing where a sample asks several (lm-eval's partial credit is a mean, not a count)."""
    if not answers or any(len(a["expected"]) != 1 for a in answers):
        return {}
    found = score(round(mean * len(answers)), len(answers))
    return {k: found[k] for k in ("n", "hits", "interval")}


def first(responses):
    """A sample's answer: lm-eval keeps a list of responses per request (one here)."""
    while isinstance(responses, list | tuple):
        responses = responses[0]
    return str(responses)


def check(tasks, tokenizer, lengths) -> None:
    """Before any model runs: lm-eval's builders imported (under the nltk guard) and every task able to build its
    samples at every length (``ruler_fit``)."""
    ruler_tasks.import_builders(tasks)
    ruler_fit.check_fits(tasks, tokenizer, lengths)


def evaluate_ruler(model, tokenizer, tokenizer_path, tasks, lengths, limit=None, label=None, **kw):
    """Records of ``model`` on every task at every length (``label``: the rope_type and factor to record; ``kw``:
    ``run_tasks``'s ``max_gen_toks`` and ``chat_template``)."""
    records = []
    for length in sorted(lengths):
        lm = lm_for(model, tokenizer, length)
        found = run_tasks(lm, tasks, length, tokenizer_path, limit, **kw)
        records += [{**(label or {}), **r} for r in found]
    return records


def evaluate_path(path, rope_type, factor, extra, tasks, lengths, limit=None, adapter=None, dtype="float32", **kw):
    """Load ``path`` with the rope type (none: as saved) and the peft ``adapter`` if any, as ``hf-rope-ext eval`` does,
    and run the tasks at every length; records carry the rope_parameters."""
    import torch

    from . import adapters, loading
    from .runner import label

    params = loading.requested_parameters(
        loading.load_config(adapters.config_folder(path, adapter)), rope_type, factor, extra
    )
    folder = adapters.tokenizer_folder(path, adapter)  # lm-eval's builders size the samples with it too
    tokenizer = loading.load_tokenizer(folder)
    check(tasks, tokenizer, lengths)
    model = loading.load_model(path, params, dtype=getattr(torch, dtype), adapter=adapter)
    tag = {"rope_type": label(rope_type), "factor": factor}
    found = evaluate_ruler(model, tokenizer, folder, tasks, lengths, limit, label=tag, **kw)
    return [{**r, "rope_parameters": params} for r in found]


def compare(path, methods, factors, tasks, limit=None, extra=None, dtype="float32", progress=True, **kw):
    """``extend --ruler``: every method (None: as saved) at the lengths ``extend`` reads it at (L0 and s x L0 with
    factor s, ``compare.method_runs``), with the parameters ``extend`` gives it (``compare.run_parameters``)."""
    import torch

    from ..util.progress import bar
    from . import compare, loading
    from .runner import label

    config = loading.load_config(path)
    pretrain = loading.pretraining_length(config)
    methods = compare.applicable_methods(config) if methods is None else list(methods)
    runs = {m: compare.method_runs(m, pretrain, factors) for m in methods}
    params = {  # every method's parameters checked before the first long run
        (m, s): compare.run_parameters(config, m, s, pretrain, extra if m is not None else None)
        for m in methods
        for s, _ in runs[m]
    }
    tokenizer = loading.load_tokenizer(path)
    check(tasks, tokenizer, sorted({n for m in methods for _, lengths in runs[m] for n in lengths}))
    records = []
    for method in bar(methods, desc="methods", nested=False, enabled=progress):
        for factor, lengths in runs[method]:
            model = loading.load_model(path, params[method, factor], dtype=getattr(torch, dtype))
            tag = {"rope_type": label(method), "factor": factor}
            found = evaluate_ruler(model, tokenizer, path, tasks, lengths, limit, label=tag, **kw)
            records += [{**r, "rope_parameters": params[method, factor]} for r in found]
    return records
