"""Glue: evaluate one model (one rope type and factor) on a set of lengths and return report records.

A record is one (rope_type, factor, length) with the measures taken there: ``perplexity`` (and ``loss``,
``documents``), ``last_chunk_loss`` (the fixed final chunk of the longest length, read with ``length`` tokens of
context), ``passkey_accuracy`` (teacher-forced) and ``passkey_generation_accuracy`` (greedy), one key per prompt, and
``multikey_accuracy`` (greedy, several keys per prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

from .adapters import config_folder, tokenizer_folder
from .data import load_token_documents, long_enough
from .last_chunk import last_chunk_losses
from .loading import load_config, load_model, load_tokenizer, requested_parameters
from .multikey import multikey_accuracy
from .passkey import passkey_accuracy
from .perplexity import CachedLosses, truncated_perplexity


@dataclass(frozen=True)
class EvalPlan:
    lengths: tuple[int, ...]
    documents: int | None = None  # documents per length (None: all long enough)
    same_documents: bool = True  # score every length on the documents long enough for the longest
    perplexity: bool = True
    last_chunk: int | None = 128  # chunk size; None: no last-chunk loss
    passkey_depths: int = 5  # 0: no passkey
    passkey_trials: int = 1
    generate: bool = True  # passkey by greedy generation too
    seed: int = 0
    far_context: bool = False  # main job only: far-context loss against the sliding-window baseline
    far_stride: int = 16  # the baseline's window stride (1: exact, every token sees L0 - 1 tokens)
    multikey_prompts: int = 0  # pass keys by generation, several per prompt (eval.multikey); 0: none
    multikey_keys: int = 3  # pass keys per prompt

    def __post_init__(self):
        if not self.lengths or any(int(x) != x or x < 2 for x in self.lengths):
            raise ValueError(f"lengths={list(self.lengths)}: expected a non-empty list of integers >= 2")


def label(rope_type) -> str:
    return "none" if rope_type in (None, "default") else str(rope_type)


def evaluate_model(
    model, tokenizer, documents, plan: EvalPlan, rope_type=None, factor=None, progress=True, losses=None, predict=None
):
    """Records for every length of ``plan``, one model; forward passes over the same window are shared (through
    ``losses``, a CachedLosses that must belong to this model alone). ``predict(model, ids (n,))``: the argmax
    prediction of each token after the first, (n - 1,), for the teacher-forced passkey (default: one forward here)."""
    lengths = sorted(plan.lengths)
    if plan.same_documents and (plan.perplexity or plan.last_chunk):
        documents = long_enough(documents, lengths[-1], plan.documents)
    losses = losses or CachedLosses()
    records = [{"rope_type": label(rope_type), "factor": factor, "length": n} for n in lengths]
    for record in records:
        n = record["length"]
        if plan.perplexity:
            record.update(truncated_perplexity(model, documents, n, plan.documents, progress, losses))
        if plan.passkey_depths or plan.multikey_prompts:
            record["split"] = "dev"  # the probes a method is chosen on (``eval.splits``)
        if plan.passkey_depths:
            depths, trials, seed = plan.passkey_depths, plan.passkey_trials, plan.seed
            found = passkey_accuracy(
                model, tokenizer, n, depths, trials, plan.generate, seed, progress=progress, predict=predict
            )
            record.update(found)
        if plan.multikey_prompts:
            keys = plan.multikey_keys
            record.update(multikey_accuracy(model, tokenizer, n, plan.multikey_prompts, keys, plan.seed, progress))
    if plan.last_chunk:
        chunk = last_chunk_losses(model, documents, lengths, plan.last_chunk, plan.documents, progress, losses)
        for record in records:
            record["last_chunk_loss"] = chunk[record["length"]]
    return records


def evaluate(
    path,
    rope_type=None,
    factor=None,
    extra=None,
    plan: EvalPlan | None = None,
    data=None,
    progress=True,
    adapter=None,
    adjust=None,
    losses=None,
    predict=None,
):
    """Load ``path`` with the rope type applied (none: as saved), and the peft ``adapter`` folder on top when given
    (``eval.adapters``), then ``adjust(model)`` when given (``eval --tiled-mlp`` tiles the MLPs there), and evaluate
    it; returns the records. ``losses`` and ``predict``: how rows are read (``evaluate_model``; ``eval
    --sequence-parallel N`` splits them over its processes)."""

    config = load_config(config_folder(path, adapter))
    rope_parameters = requested_parameters(config, rope_type, factor, extra)
    tokenizer = load_tokenizer(tokenizer_folder(path, adapter))
    documents = load_token_documents(tokenizer, data)
    model = load_model(path, rope_parameters, adapter=adapter)
    if adjust is not None:
        adjust(model)
    records = evaluate_model(model, tokenizer, documents, plan, rope_type, factor, progress, losses, predict)
    return [{**r, "rope_parameters": rope_parameters} for r in records]
