"""The report of a comparison (``eval.extend_report``) from records and plain values: a table for each measure the
plan took and none for the others, the run's facts in its first lines, the files it writes."""

from __future__ import annotations

from conftest import PNG_MAGIC

from hf_rope_ext.eval import extend_report
from hf_rope_ext.eval.runner import EvalPlan

META = {"model_sha256": "ab" * 32, "date": "2026-01-02T03:04:05Z", "command": "hf-rope-ext extend --factors 2",
        "versions": {"hf-rope-ext": "0.1.0", "torch": "2.13.0", "peft": None}}  # fmt: skip


def records() -> list[dict]:
    """Two methods at L0 = 64 and 2 x L0, with every measure a plan can take."""
    rows = []
    for name in ("none", "yarn"):
        for length, value in ((64, 3.0), (128, 5.0 if name == "none" else 3.5)):
            rows.append({"rope_type": name, "factor": None if name == "none" else 2.0, "length": length,
                         "documents": 1, "perplexity": value, "far_context_ratio": value / 3,
                         "far_context_baseline": 1.1, "last_chunk_loss": value / 2, "multikey_accuracy": 0.5,
                         "passkey_accuracy": 1.0, "passkey_by_depth": [[0.0, 1.0], [0.5, 0.0]]})  # fmt: skip
    return rows


def test_each_measure_the_plan_took_gets_its_table():
    plan = EvalPlan(
        lengths=(2,), last_chunk=32, passkey_depths=2, passkey_trials=3, multikey_prompts=1, multikey_keys=4
    )
    text = extend_report.markdown(records(), plan, META, model="m (bundled)", data=None, dtype="float32", peak_gib=0.5)
    assert text.startswith("# hf-rope-ext extend\n")
    assert "- model: `m (bundled)` (config and weights sha256 `" + "ab" * 32 + "`)" in text
    assert "documents: 1 per length" in text and "the bundled eval split" in text
    assert "- date: 2026-01-02T03:04:05Z, dtype float32, peak resident memory 0.50 GiB" in text
    assert "- versions: hf-rope-ext 0.1.0, torch 2.13.0\n" in text  # a package not installed is left out
    assert "| yarn | 3 | 3.5 |" in text and "| none | 3 | 5 |" in text  # perplexity by method and length
    assert "baseline loss 1.1000 nats" in text and "last 32 tokens" in text
    assert "1 prompts x 4 keys per cell" in text and "2 depths x 3 keys per cell" in text


def test_a_measure_the_plan_left_out_has_no_table():
    plan = EvalPlan(lengths=(2,), last_chunk=None, passkey_depths=0, multikey_prompts=0)
    text = extend_report.markdown(records(), plan, META, model="m", data=["a.txt", "b"], dtype="bfloat16", peak_gib=1)
    assert "from a.txt, b" in text and "dtype bfloat16" in text and "Perplexity" in text
    assert "Loss on the last" not in text and "Pass keys" not in text and "Passkey accuracy" not in text


def test_the_files_follow_the_plan(tmp_path):
    plan = EvalPlan(lengths=(2,), passkey_depths=1)
    written = extend_report.write_files(records(), plan, "# report\n", tmp_path, name="m", pretrain=64, meta=META)
    assert [name for _, name in written] == [
        "report.json", "perplexity.png", "far_context.png", "passkey.png", "report.md"
    ]  # fmt: skip
    assert (tmp_path / "report.md").read_text() == "# report\n" and (tmp_path / "passkey.png").read_bytes()[
        :4
    ] == PNG_MAGIC
    written = extend_report.write_files(records(), EvalPlan(lengths=(2,), passkey_depths=0), "", tmp_path, name="m",
                                        pretrain=64, meta=META)  # fmt: skip
    assert "passkey.png" not in [name for _, name in written]
