"""``--ruler`` task names and notes, checked before any work; these need no lm-eval (tests/test_ruler.py runs the
tasks)."""

from __future__ import annotations

import sys

import pytest

from hf_rope_ext.cli import main
from hf_rope_ext.eval import ruler_tasks
from hf_rope_ext.lm_eval.__main__ import named_tasks


def test_default_is_the_offline_tasks_and_names_resolve_once_in_order():
    assert ruler_tasks.resolve(None) == list(ruler_tasks.OFFLINE)
    assert ruler_tasks.resolve(["default"]) == ["niah_single_1", "niah_multikey_2", "niah_multikey_3"] + [
        "ruler_vt",
        "ruler_cwe",
        "ruler_fwe",
    ]
    assert ruler_tasks.resolve(["vt", "niah_single_1", "ruler_vt"]) == ["ruler_vt", "niah_single_1"]
    assert len(ruler_tasks.resolve(["all"])) == 13


def test_an_unknown_task_gets_a_did_you_mean_and_the_allowed_names():
    with pytest.raises(ValueError) as err:
        ruler_tasks.resolve(["niah_singel_1"])
    text = str(err.value)
    assert "--ruler 'niah_singel_1'" in text and "did you mean 'niah_single_1'" in text and "ruler_fwe" in text


def test_only_the_tasks_that_need_the_network_get_a_note():
    assert ruler_tasks.network_notes(ruler_tasks.OFFLINE) == []
    notes = ruler_tasks.network_notes(["niah_single_1", "niah_single_2", "ruler_qa_squad"])
    assert len(notes) == 2 and notes[0].startswith("niah_single_2: its data needs the network (Paul Graham")
    assert ruler_tasks.needs_punkt(["niah_multikey_1"]) and not ruler_tasks.needs_punkt(ruler_tasks.OFFLINE)


def test_a_bad_task_name_stops_the_command_in_one_line_before_any_work(tmp_path, capsys):
    rc = main(["eval", "--ruler", "niah_single_1,niah_multikey_9", "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "did you mean 'niah_multikey_" in err[0], err
    assert not (tmp_path / "r").exists()


def test_without_lm_eval_the_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    rc = main(["eval", "--ruler", "--lengths", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "pip install 'hf-rope-ext[eval]'" in err[-1] and "Traceback" not in "".join(err)


def test_the_module_cli_reads_the_task_names_it_is_given():
    argv = ["--model", "hf-rope-ext", "--tasks", "niah_single_1,ruler_vt", "cwe", "--limit", "2", "--tasks=fwe"]
    assert named_tasks(argv) == ["niah_single_1", "ruler_vt", "cwe", "fwe"]
