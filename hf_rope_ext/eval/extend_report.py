"""The report of a comparison across methods (``hf-rope-ext extend``): the Markdown (what was run, then one table per
measure the plan took) and the files (report.md, report.json with the run's metadata, the plots), from the
comparison's records, the :class:`~hf_rope_ext.eval.runner.EvalPlan` they were measured with and plain values."""

from __future__ import annotations

from pathlib import Path

from . import report
from .runner import EvalPlan

FAR_TITLE = "far-context ratio vs length (below 1: the context beyond L0 helps)"


def markdown(
    records: list[dict], plan: EvalPlan, meta: dict, *, model: str, data: list[str] | None, dtype: str, peak_gib: float
) -> str:
    """The Markdown report: what was run (``model`` as the reader should see it, the ``data`` given or None for the
    bundled split, ``dtype``, the peak resident memory, ``meta``: ``eval.metadata.run_metadata``), then the tables."""
    parts = [
        header(records, meta, model, data, f"dtype {dtype}, peak resident memory {peak_gib:.2f} GiB"),
        "Perplexity (at s x L0 the method runs with factor s; at L0 with the smallest factor):",
        "",
        report.pivot_table(records, "perplexity"),
        "",
    ]
    if any("far_context_ratio" in r for r in records):
        parts += [far_context_intro(records), "", report.pivot_table(records, "far_context_ratio"), ""]
    if plan.last_chunk:
        parts += [f"Loss on the last {plan.last_chunk} tokens as the context grows (largest factor):", ""]
        parts += [report.pivot_table(records, "last_chunk_loss"), ""]
    if plan.multikey_prompts:
        parts += [
            f"Pass keys by greedy generation ({plan.multikey_prompts} prompts x {plan.multikey_keys} keys per cell, "
            "each prompt read once and every key asked through its KV cache):",
            "",
            report.pivot_table(records, "multikey_accuracy"),
            "",
        ]
    if plan.passkey_depths:
        parts += [
            f"Passkey accuracy (teacher-forced; {plan.passkey_depths} depths x {plan.passkey_trials} keys per cell):",
            "",
            report.pivot_table(records, "passkey_accuracy"),
            "",
        ]
    return "\n".join(parts)


def header(records: list[dict], meta: dict, model: str, data: list[str] | None, run: str) -> str:
    """Model, documents, date (with ``run``: dtype and memory), the command line and the versions, as the report's
    first lines."""
    source = "the bundled eval split (stdlib files)" if data is None else ", ".join(data)
    counts = sorted({r["documents"] for r in records if "documents" in r})
    versions = ", ".join(f"{name} {v}" for name, v in meta["versions"].items() if v)
    return "\n".join(
        [
            "# hf-rope-ext extend",
            "",
            f"- model: `{model}` (config and weights sha256 `{meta['model_sha256']}`)",
            f"- documents: {'/'.join(map(str, counts)) or '-'} per length, the first long enough for the longest "
            f"length in file order, from {source}",
            f"- date: {meta['date']}, {run}",
            f"- command (equivalent): `{meta['command']}`",
            f"- versions: {versions}",
            "",
        ]
    )


def far_context_intro(records: list[dict]) -> str:
    base = next(r["far_context_baseline"] for r in records if "far_context_baseline" in r)
    return (
        "Far-context perplexity ratio: loss on the last L0 - 1 tokens of the longest window, read with N tokens of "
        "context, against the model as saved reading the same tokens through a sliding L0-token window "
        f"(baseline loss {base:.4f} nats); exp(loss - baseline), below 1 only where the longer context helps:"
    )


def write_files(
    records: list[dict], plan: EvalPlan, text: str, out: Path, *, name: str, pretrain: int, meta: dict
) -> list[tuple[str, str]]:
    """report.md (``text``), report.json (records and ``meta``) and the plots of model ``name`` (L0 ``pretrain``)
    into ``out``; returns (what, file name) pairs."""
    (out / "report.md").write_text(text, encoding="utf-8")
    report.write_json(records, out / "report.json", meta)
    report.plot_perplexity(records, out / "perplexity.png", pretrain, title=f"{name}: perplexity vs length")
    written = [("report", "report.json"), ("plot", "perplexity.png")]
    if any("far_context_ratio" in r for r in records):
        report.plot_far_context(records, out / "far_context.png", f"{name}: {FAR_TITLE}")
        written.append(("far-context plot", "far_context.png"))
    if plan.passkey_depths:
        title = f"{name}: passkey accuracy (teacher-forced) by depth and length"
        report.plot_passkey_grid(records, out / "passkey.png", title)
        written.append(("passkey heatmaps", "passkey.png"))
    return written + [("report.md", "report.md")]
