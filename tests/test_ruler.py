"""lm-eval's RULER tasks end to end on the bundled tiny Llama (byte-level, trained at 512 tokens) read at 1024: the
score lm-eval reports against one computed here from the same samples, the report files, the lm-eval
model ``hf-rope-ext`` and ``python -m hf_rope_ext.lm_eval``. Skipped, saying so, only without the [eval] extra."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

for module in ("lm_eval", "nltk", "wonderwords"):
    pytest.importorskip(module, reason=f"{module} not installed: the [eval] extra (pip install 'hf-rope-ext[eval]')")

from hf_rope_ext.cli import main  # noqa: E402
from hf_rope_ext.eval import loading, ruler, ruler_tasks  # noqa: E402
from hf_rope_ext.store import bundled  # noqa: E402

MODEL = bundled.default_model_path()
LENGTH = 1024  # 2 x L0; the smallest length lm-eval's needle builders fill for a byte-level tokenizer with room
TASKS = ["niah_single_1"]


def own_score(answers: list[dict]) -> float:
    """RULER's string_match_all, written here: per sample the share of expected values found in the answer
    (case-insensitive), averaged over samples."""
    shares = [sum(v.lower() in a["answer"].lower() for v in a["expected"]) / len(a["expected"]) for a in answers]
    return sum(shares) / len(shares)


@pytest.fixture(scope="module")
def records():
    """The model as saved, with lm-eval's own 128 generated tokens: it echoes the first sample's value late in its
    answer (a score above 0, so that the comparison compares a hit; the misses are in the tests below)."""
    return ruler.evaluate_path(MODEL, None, None, {}, TASKS, [LENGTH], limit=1)


def test_lm_eval_scores_each_task_as_the_test_does_from_the_same_samples(records):
    assert [r["task"] for r in records] == TASKS
    for r in records:
        assert r["rope_type"] == "none" and r["factor"] is None and r["length"] == LENGTH
        assert r["samples"] == len(r["answers"]) == 1
        assert r["ruler_score"] == pytest.approx(own_score(r["answers"])) and r["chat_template"] is False
    assert records[0]["ruler_score"] > 0, records[0]  # a hit: the check compares something


def test_lm_eval_reads_at_most_the_length_and_the_model_keeps_its_rope_type():
    model = loading.load_model(MODEL, loading.requested_parameters(loading.load_config(MODEL), "yarn", 2.0))
    lm = ruler.lm_for(model, loading.load_tokenizer(MODEL), LENGTH)
    assert lm.max_length == LENGTH  # not the saved max_position_embeddings (512), which would cut the haystack
    assert lm.model.config.rope_parameters["rope_type"] == "yarn"


def test_the_task_table_matches_lm_evals_builders():
    ruler_tasks.import_builders(ruler_tasks.OFFLINE)
    from lm_eval.tasks.ruler import niah_utils

    for task in ruler_tasks.OFFLINE + ruler_tasks.ESSAY:
        if task.startswith("niah"):
            source = inspect.getsource(getattr(niah_utils, task))
            essay = 'get_haystack(type_haystack="essay")' in source
            assert essay == (task in ruler_tasks.ESSAY), task
    group = (Path(niah_utils.__file__).parent / "ruler.yaml").read_text()
    assert re.findall(r"^  - (\w+)$", group, re.M) == list(ruler_tasks.OFFLINE[:1] + ruler_tasks.ESSAY[:3]) + [
        "niah_multikey_2",
        "niah_multikey_3",
        "niah_multiquery",
        "niah_multivalue",
        "ruler_vt",
        "ruler_cwe",
        "ruler_fwe",
        "ruler_qa_squad",
        "ruler_qa_hotpot",
    ]
    assert sorted(re.findall(r"^  - (\w+)$", group, re.M)) == sorted(ruler_tasks.TASKS)


def test_a_builder_that_would_loop_forever_is_refused_before_any_work(tmp_path, capsys):
    rc = main(["eval", "--ruler", "vt", "--lengths", "1024", "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "ruler_vt at 1024 tokens: its in-context example takes" in err[-1], err
    assert not (tmp_path / "r").exists()


def test_the_command_writes_the_report_json_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "ruler"
    argv = ["eval", "--ruler", "niah_multikey_2", "--rope-type", "yarn", "--factor", "2", "--lengths", str(LENGTH)]
    assert main([*argv, "--limit", "1", "--max-gen-toks", "8", "--report-dir", str(out), "--no-progress"]) == 0
    data = json.loads((out / "report.json").read_text())
    (record,) = data["records"]
    assert record["task"] == "niah_multikey_2" and record["samples"] == 1 and data["metadata"]["lm_eval"]
    assert record["rope_parameters"]["rope_type"] == "yarn" and len(record["answers"][0]["answer"]) <= 8 * 4
    assert record["ruler_score"] == pytest.approx(own_score(record["answers"]))
    hits = round(own_score(record["answers"]))  # one value asked a sample: a hit or a miss
    assert (record["n"], record["hits"]) == (1, hits) and record["interval"] == [[0.0, 0.7935], [0.2065, 1.0]][hits]
    assert f"| yarn | {hits}/1 [{0.21 * hits:.2f}, {0.79 + 0.21 * hits:.2f}] |" in (out / "report.md").read_text()
    assert (out / "ruler.png").stat().st_size > 0
    assert main([*argv, "--report-dir", str(out)]) == 2  # an existing report is not overwritten without --overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_the_chat_template_wraps_every_prompt_only_when_asked(monkeypatch):
    """``chat_template=True`` (``--apply-chat-template``): lm-eval puts each prompt in the tokenizer's chat template as
    a user turn, and the record says so (without it the prompt is the task's plain text: the records fixture)."""
    tokenizer = loading.load_tokenizer(MODEL)
    turns = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}[/{{ m['role'] }}]{% endfor %}"
    tokenizer.chat_template = turns + "{% if add_generation_prompt %}[assistant]{% endif %}"
    lm = ruler.lm_for(loading.load_model(MODEL), tokenizer, LENGTH)
    seen = []
    monkeypatch.setattr(lm, "generate_until", lambda requests, **kw: [seen.append(r.args[0]) or "x" for r in requests])
    (templated,) = ruler.run_tasks(lm, TASKS, LENGTH, MODEL, limit=1, chat_template=True)
    assert seen[0].startswith("[user]A special magic number is hidden") and "[/user][assistant]" in seen[0], seen[0]
    assert templated["chat_template"] is True


def test_lm_eval_finds_the_model_with_the_rope_type_from_its_model_args():
    from lm_eval.api.registry import get_model

    from hf_rope_ext.lm_eval import register

    cls = get_model(register())
    lm = cls.create_from_arg_string(f"pretrained={MODEL},rope_type=yarn,factor=2,beta_fast=16,dtype=float32")
    params = lm.model.config.rope_parameters
    assert params["rope_type"] == "yarn" and params["factor"] == 2.0 and params["beta_fast"] == 16
    assert lm.max_length == 1024  # factor x L0, not the saved max_position_embeddings
    lm = cls.create_from_arg_string(f"pretrained={MODEL},rope_type=self_extend,group_size=3,window=128,max_length=900")
    assert lm.model.config.rope_parameters["window"] == 128 and lm.max_length == 900
    with pytest.raises(ValueError, match=r"windw=.*did you mean 'window'"):
        cls.create_from_arg_string(f"pretrained={MODEL},rope_type=self_extend,group_size=3,windw=128")


def test_python_m_hf_rope_ext_lm_eval_runs_lm_evals_own_command_line(tmp_path, capsys):
    from hf_rope_ext.lm_eval.__main__ import main as lm_eval_main

    args = f"pretrained={MODEL},rope_type=yarn,factor=2"
    lm_eval_main(
        ["--model", "hf-rope-ext", "--model_args", args, "--tasks", "niah_single_1"]  # lm-eval's device: cuda:0
        + ["--metadata", json.dumps({"max_seq_lengths": [LENGTH]}), "--limit", "1"]
        + ["--gen_kwargs", "max_gen_toks=8", "--output_path", str(tmp_path / "out")]
    )
    out = capsys.readouterr().out
    assert "niah_single_1" in out and str(LENGTH) in out, out


def test_the_lm_eval_model_takes_the_device_as_lm_evals_own_hf_model(monkeypatch, capsys):
    """The device asked for where it exists; a CUDA device on a machine without CUDA falls back to the CPU with a
    note; nothing asked for: CUDA when there is one."""
    from hf_rope_ext.lm_eval.model import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cuda:0") == "cpu" and "no CUDA here" in capsys.readouterr().err
    assert resolve_device(None) == "cpu" and resolve_device("cpu") == "cpu" and capsys.readouterr().err == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("cuda:1") == "cuda:1" and resolve_device(None) == "cuda"


def test_extend_runs_ruler_across_its_methods_at_its_lengths(tmp_path):
    from conftest import save_byte_llama

    base = save_byte_llama(tmp_path / "base", 1024)  # L0 1024 bytes: room for lm-eval's needle prompt at L0
    out = tmp_path / "report"
    argv = ["extend", "--model", str(base), "--methods", "none,yarn", "--factors", "2", "--ruler", "niah_single_1"]
    assert main([*argv, "--limit", "1", "--max-gen-toks", "4", "--report-dir", str(out), "--no-progress"]) == 0
    records = json.loads((out / "report.json").read_text())["records"]
    cells = sorted((r["rope_type"], r["factor"], r["length"]) for r in records)
    assert cells == [("none", None, 1024), ("none", None, 2048), ("yarn", 2.0, 1024), ("yarn", 2.0, 2048)]
    assert all(r["samples"] == 1 and r["ruler_score"] == own_score(r["answers"]) for r in records)
    assert "| yarn |" in (out / "report.md").read_text() and (out / "ruler.png").is_file()
