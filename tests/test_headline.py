"""``experiments/headline.py``: the configurations are chosen on the dev records by the stated rule, every dev record
gains its count and interval, a test log counts only the test split's own prompts, and the table gives a target's
verdict by the interval's lower bound; README and the results page show the table of the committed records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import save_eval_llama

from hf_rope_ext.eval import probes, splits
from hf_rope_ext.eval.loading import load_tokenizer


@pytest.fixture
def headline():
    path = Path(__file__).resolve().parents[1] / "experiments" / "headline.py"
    spec = importlib.util.spec_from_file_location("headline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cell(hits: int, n: int, length: int = 32768, **extra) -> list[dict]:
    record = {"rope_type": "x (float32)", "length": length, "multikey_accuracy": hits / n, "multikey_probes": n}
    return [{**record, "rope_parameters": {"rope_type": "self_extend", "window": 2048}, **extra}]


def dev_results() -> dict:
    return {
        "baseline:4:float32": 2.4,
        "self_extend:4 float32": cell(9, 12),
        "self_extend:4:1key float32": cell(10, 10),
        "rerope:4 float32": cell(10, 12),
        "rerope:4:1key float32": cell(8, 10),  # 18 in all: one fewer than self_extend's 19
        "string:4 float32": cell(12, 12),  # no classic probe: not a candidate
        "lora@a:4 float32": cell(11, 12),
        "lora@a:4:1key float32": cell(10, 10),
        "lora@b:4 float32": cell(12, 12, length=8192),  # 8k only: not a candidate
    }


def test_the_choice_is_the_most_hits_over_both_dev_probes_at_32k(headline):
    assert headline.choose(dev_results()) == {"adapter": "lora@a:4", "training-free": "self_extend:4"}


def test_every_dev_record_gains_its_split_count_and_interval(headline):
    done = dev_results()
    headline.annotate_dev(done)
    record = done["self_extend:4 float32"][0]
    assert (record["split"], record["multikey_hits"], record["multikey_interval"]) == ("dev", 9, [0.4677, 0.9111])
    assert done["baseline:4:float32"] == 2.4


def test_a_test_log_counts_only_the_test_splits_own_prompts(headline, tmp_path, monkeypatch):
    tokenizer = load_tokenizer(save_eval_llama(tmp_path / "tiny"))
    monkeypatch.setattr(headline, "LENGTH", 640)
    monkeypatch.setattr(headline, "SAMPLES", {"classic": 3, "multikey": 1})
    chosen = splits.prompts(tokenizer, "test", "classic", 640, 3)
    line = lambda p, sha, answer: {
        "cell": {},
        "prompt_id": p.prompt_id,
        "prompt_sha": sha,
        "probes": [[0.5, p.needles[0].key, answer, True]],
    }  # noqa: E731,E501
    log = tmp_path / "log.jsonl"
    lines = [line(chosen[0], probes.prompt_sha(chosen[0]), f" {chosen[0].needles[0].key}")]
    lines += [line(chosen[1], probes.prompt_sha(chosen[1]), " 1"), line(chosen[2], "another prompt", " 1")]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (record,) = headline.test_records(tokenizer, "se", log)
    assert (record["probe"], record["split"], record["n"], record["hits"], record["planned"]) == (
        "classic",
        "test",
        2,
        1,
        3,
    )
    assert "--split test" in record["command"] and "(2 of 3 prompts so far)" in headline.progress(record)


def test_the_table_says_met_only_when_the_lower_bound_clears_the_target(headline):
    done = {
        **dev_results(),
        "self_extend:4 float32": cell(9, 12),
        "lora@smollm2-self-extend-retrieval-lora:4 float32": cell(1, 1),
    }
    done["lora@smollm2-self-extend-retrieval-lora:4:1key float32"] = cell(1, 1)
    done["test:se:classic"] = [
        {"split": "test", "probe": "classic", "planned": 30, "n": 30, "hits": 30, "interval": [0.8865, 1.0]}
    ]
    done["test:se:multikey"] = [
        {"split": "test", "probe": "multikey", "planned": 8, "n": 24, "hits": 20, "interval": [0.6412, 0.9332]}
    ]
    headline.annotate_dev(done)
    text = headline.table(done, {})
    assert "| classic | 10/10 [0.72, 1.00] | 30/30 [0.89, 1.00] | 80% | met |" in text
    assert "| multikey | 9/12 [0.47, 0.91] | 20/24 [0.64, 0.93] | 80% | not shown at this sample size |" in text


@pytest.mark.parametrize("page", ["README.md", "docs/results/real-model.md"])
def test_the_pages_show_the_table_of_the_committed_records(headline, page):
    """What ``headline.py --write`` puts between ``<!-- results:start -->`` and ``<!-- results:end -->``."""
    done = json.loads((headline.RESULTS / "results.json").read_text())
    text = (headline.ROOT / page).read_text()
    shown = text.split("<!-- results:start -->\n")[1].split("\n<!-- results:end -->")[0]
    assert shown == headline.table(done, headline.choose(done)).strip()
    assert "test (held out)" in shown and done["test:se:multikey"][0]["split"] == "test"
