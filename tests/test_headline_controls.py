"""``experiments/headline_controls.py``: a control log counts only the paired prompts' own lines, every key is paired
with the same key of the other run, wordings are told apart, where each line ran is named, and the tables are made
from the records alone."""

from __future__ import annotations

import json

import pytest
from conftest import load_script

from hf_rope_ext.eval import probes, splits

SHORT, LONG = 640, 1280  # ByT5 tokens: the tiny tokenizer's 1x and "4x"


@pytest.fixture
def controls(monkeypatch, tmp_path):
    module = load_script("headline_controls")
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    monkeypatch.setattr(module, "LONG", LONG)
    monkeypatch.setattr(module, "SAMPLES", {"classic": 3, "multikey": 2})
    cells = {
        "as-saved-8192": module.Cell("as saved", SHORT, "saved.jsonl", multikey=2),
        "se-32768": module.Cell("self_extend", LONG, "se.jsonl", multikey=2),
    }
    monkeypatch.setattr(module, "CELLS", cells)
    return module


def write_log(path, prompts, answer, provenance=None):
    """A log of ``prompts``, each key answered by ``answer(key)``."""
    lines = []
    for p in prompts:
        line = {"cell": {}, "prompt_id": p.prompt_id, "prompt_sha": probes.prompt_sha(p)}
        line["probes"] = [[n.depth, n.key, answer(n.key), None] for n in p.needles]
        lines.append(line | ({} if provenance is None else {"provenance": provenance}))
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_log_counts_the_paired_prompts_own_lines_and_names_where_they_ran(controls, probe_tokenizer, tmp_path):
    paired = splits.prompts(probe_tokenizer, "test", "classic", SHORT, 3, seeds_of=LONG)
    own = splits.prompts(probe_tokenizer, "test", "classic", SHORT, 3)  # same length, not the long prompts' seeds
    ran = {"commit": "a" * 40, "clean": False}
    write_log(tmp_path / "saved.jsonl", paired[:2] + own[2:], lambda key: f" {key}.", ran)
    other = json.loads((tmp_path / "saved.jsonl").read_text().splitlines()[0])  # the id of prompt 2, other tokens
    other |= {"prompt_id": paired[2].prompt_id, "prompt_sha": "another prompt"}
    with (tmp_path / "saved.jsonl").open("a") as handle:
        handle.write(json.dumps(other) + "\n")
    keys = controls.read_log(probe_tokenizer, controls.CELLS["as-saved-8192"], "classic")
    assert [k["prompt"] for k in keys] == [0, 1] and all(k["hit"] and k["named"] for k in keys)
    assert controls.commits([k["provenance"] for k in keys]) == "aaaaaaa+dirty"
    assert {k["wording"] for k in keys} <= {0, 1, 2}
    for k, prompt in zip(keys, paired, strict=False):
        assert splits.TEST_WORDINGS[k["wording"]][1].format(name="X").split("X")[0] in prompt.needles[0].question
    write_log(tmp_path / "se.jsonl", splits.prompts(probe_tokenizer, "test", "classic", LONG, 3), lambda key: " 1")
    unrecorded = controls.read_log(probe_tokenizer, controls.CELLS["se-32768"], "classic")
    provenances = [k["provenance"] for k in unrecorded]
    assert controls.commits(provenances) == controls.UNRECORDED and not any(k["hit"] for k in unrecorded)


def test_keys_are_paired_with_the_same_key_of_the_other_run(controls):
    key = lambda p, i, number, hit: {"prompt": p, "needle": i, "key": number, "hit": hit}  # noqa: E731
    first = [key(0, 0, 11, True), key(1, 0, 12, True), key(2, 0, 13, False)]
    second = [key(0, 0, 11, False), key(2, 0, 13, True)]  # prompt 1 not asked yet
    result = controls.pair(first, second)
    assert (result["keys"], result["only_first"], result["only_second"], result["both"]) == (2, 1, 1, 0)
    with pytest.raises(ValueError, match="asked different keys"):
        controls.pair(first, [key(0, 0, 99, True)])


def test_the_tables_are_made_from_the_records_alone(controls, probe_tokenizer, tmp_path):
    """records -> results.json -> keys_of: the same counts, the multikey interval over prompts, per wording."""
    for name, cell in controls.CELLS.items():
        answer = (lambda key: f" {key}") if name == "as-saved-8192" else (lambda key: f": {key}")
        chosen = [p for probe in controls.SAMPLES for p in splits.prompts(
            probe_tokenizer, "test", probe, cell.length, 2, cell.seeds_of)]  # fmt: skip
        write_log(tmp_path / cell.log, chosen, answer)
    done = json.loads(json.dumps(controls.records(probe_tokenizer)))
    keys = controls.keys_of(done)
    saved, long = done["control:as-saved-8192:multikey"][0], done["test:se:multikey"][0]
    assert (saved["hits"], saved["n"], long["hits"], long["named"]["hits"]) == (6, 6, 0, 6)
    assert saved["interval_kind"] == "Wilson by prompt" and saved["prompts"] == 2 and saved["planned"] == 2
    assert [k["hit"] for k in keys["se-32768", "classic"]] == [False, False]
    assert controls.pair(keys["as-saved-8192", "classic"], keys["se-32768", "classic"])["only_first"] == 2
    rows = controls.wording_table(keys).splitlines()
    counts = [sum(int(c.split("/")[1]) for c in row.strip("| ").split(" | ")[3:] if "/" in c) for row in rows[2:]]
    assert counts == [8, 8]  # 2 classic + 2 x 3 multikey keys a cell, each under one wording


def test_the_controls_page_is_the_page_of_the_committed_records():
    module = load_script("headline_controls")
    done = json.loads((module.RESULTS / "results.json").read_text())
    assert module.PAGE.read_text() == module.page(done, json.loads(module.HISTORY.read_text()))
    assert done["control:as-saved-8192:classic"][0]["per_key"], "the 1x control of the headline is recorded"
