"""The main job: read a pretrained RoPE model beyond its training length, method by method, and report.

``run_comparison`` evaluates every applicable method (the model as saved, transformers' ``linear``, ``dynamic``,
``yarn``, and every training-free type of this package, attention-level ones included, found in the registry at run
time) at s x L0 with factor s, for s in ``factors``, plus L0 itself with the smallest factor; a type without a
``factor`` runs once over every length. The last-chunk loss is read with the largest factor at every length. The
far-context loss (``eval.far_context``) is read by each method at each of its lengths on the last L0 - 1 tokens of
the longest length's window, against the model as saved reading them through a sliding L0-token window.
``save_extended`` writes one patched model (config with the rope parameters), its model card and its report.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models import layout_of
from ..publish import cards
from ..types import registry
from ..types.rope_parameters import extended_max_positions
from ..util.progress import bar
from . import loading
from .data import load_token_documents, long_enough
from .far_context import sliding_window_baseline, with_far_context
from .last_chunk import last_chunk_losses
from .perplexity import CachedLosses
from .runner import EvalPlan, evaluate_model, label

BUILTIN_METHODS = ("linear", "dynamic", "yarn")
DEFAULT_FACTORS = (2.0, 4.0, 8.0)


def applicable_methods(config) -> list[str | None]:
    """None (as saved), transformers' linear/dynamic/yarn, then the registry's training-free types for this family."""
    model_type = getattr(config, "model_type", None)
    ours = [m.name for m in registry.methods() if m.training_free and (m.families is None or model_type in m.families)]
    return [None, *BUILTIN_METHODS, *ours]


def takes_factor(rope_type) -> bool:
    return rope_type not in loading.NONE_TYPES and "factor" in loading.accepted_keys(rope_type)


def default_parameters(rope_type, pretrain: int, factor: float | None) -> dict:
    """The method's own defaults (``RopeMethod.defaults``); nothing for the model as saved."""
    return {} if rope_type in loading.NONE_TYPES else registry.default_parameters(rope_type, pretrain, factor)


def method_runs(rope_type, pretrain: int, factors) -> list[tuple[float | None, list[int]]]:
    """(factor, lengths) pairs for one method: s x L0 with factor s (L0 too with the smallest); all lengths once for
    a type that one model serves at every factor (no factor of its own, and defaults that do not depend on it)."""
    factors = sorted(factors)
    if not takes_factor(rope_type) and not factor_dependent(rope_type, pretrain, factors):
        return [(None, [pretrain, *(int(s * pretrain) for s in factors)])]
    return [(s, ([pretrain] if s == factors[0] else []) + [int(s * pretrain)]) for s in factors]


def factor_dependent(rope_type, pretrain: int, factors) -> bool:
    """Whether ``default_parameters`` at any of the factors differ from those without one (Self-Extend's group,
    STRING's frequency type underneath), so that each factor needs a model of its own."""
    plain = default_parameters(rope_type, pretrain, None)
    return any(default_parameters(rope_type, pretrain, s) != plain for s in factors)


def evaluate_method(
    path,
    config,
    tokenizer,
    documents,
    rope_type,
    factors,
    base_plan: EvalPlan,
    progress=True,
    extra=None,
    far=None,
    dtype="float32",
):
    """Records of one method over its runs, plus the last-chunk loss at every length with the largest factor and,
    with ``far`` (the sliding-window baseline loss), the far-context loss and ratio at every length of every run."""
    pretrain = loading.pretraining_length(config)
    runs = method_runs(rope_type, pretrain, factors)
    records = []
    for factor, lengths in runs:
        params = run_parameters(config, rope_type, factor, pretrain, extra if rope_type is not None else None)
        model = loading.load_model(path, params, dtype=getattr(torch, dtype))
        cache = CachedLosses()
        plan = EvalPlan(**{**base_plan.__dict__, "lengths": tuple(lengths), "last_chunk": None})
        found = evaluate_model(model, tokenizer, documents, plan, rope_type, factor, progress, cache)
        if far is not None:
            total = int(max(factors) * pretrain)
            found = with_far_context(model, found, documents, total, pretrain, far, plan.documents, progress, cache)
        records += [{**r, "rope_parameters": params} for r in found]
        if factor == runs[-1][0] and base_plan.last_chunk:
            contexts = [pretrain, *(int(s * pretrain) for s in sorted(factors))]
            chunk = last_chunk_losses(
                model, documents, contexts, base_plan.last_chunk, base_plan.documents, progress, cache
            )
            records = merge_last_chunk(records, chunk, label(rope_type), factor, params)
    return records


def far_context_baseline(path, config, documents, factors, plan: EvalPlan, dtype="float32") -> float:
    """The model as saved, reading the last L0 - 1 tokens of the longest window through a sliding L0 window."""
    pretrain = loading.pretraining_length(config)
    params = loading.requested_parameters(config, None, None, None)
    model = loading.load_model(path, params, dtype=getattr(torch, dtype))
    total = int(max(factors) * pretrain)
    return sliding_window_baseline(model, documents, total, pretrain, pretrain - 1, plan.documents, plan.far_stride)


def run_parameters(config, rope_type, factor, pretrain: int, extra: dict | None = None):
    """rope_parameters for extension factor ``factor``: the type's ``factor`` (or, for leaky_rerope, the slope that
    fits s x L0 into L0) and defaults for its other required keys, then the user's ``extra`` over them."""
    if rope_type in loading.NONE_TYPES:
        return loading.requested_parameters(config, rope_type, None, extra)
    chosen = {**default_parameters(rope_type, pretrain, factor), **(extra or {})}
    own_factor = factor if takes_factor(rope_type) and "factor" not in chosen else None
    return loading.requested_parameters(config, rope_type, own_factor, chosen)


def merge_last_chunk(records: list[dict], chunk: dict, name: str, factor, params) -> list[dict]:
    """Add ``last_chunk_loss`` to the (name, factor, length) records, creating the missing ones."""
    for length, loss in chunk.items():
        match = [r for r in records if r["rope_type"] == name and r["factor"] == factor and r["length"] == length]
        if not match:
            match = [{"rope_type": name, "factor": factor, "length": length, "rope_parameters": params}]
            records.append(match[0])
        match[0]["last_chunk_loss"] = loss
    return sorted(records, key=lambda r: (r["length"], r["factor"] or 0))


def run_comparison(
    path, methods=None, factors=DEFAULT_FACTORS, plan=None, data=None, progress=True, extra=None, dtype="float32"
):
    """Records of every method in ``methods`` (default: ``applicable_methods``) at the lengths the factors give;
    ``plan`` sets what is measured (its lengths are ignored); ``extra`` parameters go to every type but none;
    ``dtype`` ("float32" or "bfloat16") the models are loaded in."""
    config = loading.load_config(path)  # a model without RoPE is refused here, naming its model_type
    pretrain = loading.pretraining_length(config)
    factors = sorted(float(s) for s in factors)
    if any(s < 1 for s in factors):
        raise ValueError(f"factors={factors}: every factor must be >= 1")
    plan = plan or EvalPlan(lengths=(pretrain,))
    methods = applicable_methods(config) if methods is None else list(methods)
    for rope_type in methods:  # fail early on an unknown type or bad parameters, before any long run
        for factor, _ in method_runs(rope_type, pretrain, factors):
            run_parameters(config, rope_type, factor, pretrain, extra if rope_type is not None else None)
    tokenizer = loading.load_tokenizer(path)
    documents = long_enough(load_token_documents(tokenizer, data), int(factors[-1] * pretrain), plan.documents)
    far = far_context_baseline(path, config, documents, factors, plan, dtype) if plan.far_context else None
    records = []
    for rope_type in bar(methods, desc="methods", nested=False, enabled=progress):
        args = (documents, rope_type, factors, plan, progress, extra, far, dtype)
        records += evaluate_method(path, config, tokenizer, *args)
    return records


def has_position_table(model) -> bool:
    """Whether the checkpoint holds a table of ``max_position_embeddings`` position rows (RoFormer's sinusoids):
    its length is then fixed by the weights, and stays as saved."""
    rows = model.config.max_position_embeddings
    return any("position" in name and t.shape[:1] == (rows,) for name, t in model.state_dict().items())


def save_extended(path, rope_type, factor, out, records, plot=None, extra=None, model_id=None, length=None) -> Path:
    """Save the model patched with ``rope_type`` into the folder ``out``: weights, a config carrying the rope
    parameters, the tokenizer and the model card (whose README.md path is returned); ``model_id``: the folder the card
    names (default ``out``; a staging folder is renamed after this).

    The config states the extended length ``length`` (default ``factor`` x L0) as ``max_position_embeddings``, what
    transformers, vLLM or TGI read as the model's context, and L0 as ``original_max_position_embeddings`` in the rope
    parameters wherever the type takes it (see ``configure.pretraining_length``, ``extended_max_positions``)."""
    from transformers import AutoConfig

    path = loading.check_model_path(path)
    config = AutoConfig.from_pretrained(path)
    pretrain = loading.pretraining_length(config)
    params = run_parameters(config, rope_type, factor, pretrain, extra)
    if params is None:
        raise ValueError(
            "rope_type: --out saves a patched model and needs --rope-type (and --factor where it takes one)"
        )
    model = loading.load_model(path, params)
    if not has_position_table(model):
        model.config.max_position_embeddings = extended_max_positions(rope_type, pretrain, length or factor * pretrain)
    model.save_pretrained(out)
    loading.load_tokenizer(path).save_pretrained(out)
    return cards.write_model_card(
        out,
        kind="extended",
        base_model=str(path),
        rope_parameters=params,
        rope_layout=layout_of(config),
        results=records,
        plot=plot,
        model_id=str(Path(model_id or out).resolve()),
        training=None,
        license=None,
        tags=None,
        notes=None,
    )
