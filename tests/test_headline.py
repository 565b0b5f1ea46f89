"""``experiments/headline.py``: the configurations are chosen on the dev records by the stated rule, every dev record
gains its count and interval, a test log counts only the test split's own prompts, and the table gives a target's
verdict by the interval's lower bound; README and the results page show the table of the committed records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


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


def keyed(hits: int, n: int, per_prompt: int = 1) -> dict:
    """A record of ``n`` keys, ``per_prompt`` a prompt, the first ``hits`` answered with their key."""
    rows = [[i // per_prompt, i % per_prompt, 1000 + i, 0, f" {1000 + i if i < hits else 7}."] for i in range(n)]
    return {"n": n, "hits": hits, "per_key": rows}


def test_the_table_says_met_only_when_the_lower_bound_clears_the_target(headline):
    done = {
        **dev_results(),
        "self_extend:4 float32": cell(9, 12),
        "lora@smollm2-self-extend-retrieval-lora:4 float32": cell(1, 1),
    }
    done["lora@smollm2-self-extend-retrieval-lora:4:1key float32"] = cell(1, 1)
    done["test:se:classic"] = [keyed(30, 30)]
    done["test:se:multikey"] = [keyed(20, 24, per_prompt=3)]
    done["control:as-saved-8192:classic"] = [keyed(25, 30)]
    headline.annotate_dev(done)
    text = headline.table(done, {})
    assert "| classic | 10/10 [0.72, 1.00] * | 30/30 [0.89, 1.00] | - | 25/30 [0.66, 0.93] |" in text
    assert "| 25/25 [0.87, 1.00] | 5/5 [0.57, 1.00] | +5/-0 of 30, p=0.062 | 80% | met |" in text
    lo, hi = headline.controls.paired.by_prompt([(3, 3)] * 6 + [(2, 3), (0, 3)])
    multikey = f"| multikey | 9/12 [0.47, 0.91] * | 20/24 [{lo:.2f}, {hi:.2f}] (by prompt) (8 of 24 so far) |"
    assert multikey + " - | - | - | - | - | 80% |" in text
    done["dev-rerun:se:classic"] = [{"probe": "classic", "n": 10, "hits": 7, "interval": [0.4, 0.9], "planned": 10}]
    assert "| classic | 7/10 [0.40, 0.89] | 30/30" in headline.table(done, {})


@pytest.mark.parametrize("page", ["README.md", "docs/results/real-model.md"])
def test_the_pages_show_the_table_of_the_committed_records(headline, page):
    """What ``headline.py --write`` puts between ``<!-- results:start -->`` and ``<!-- results:end -->``."""
    done = json.loads((headline.RESULTS / "results.json").read_text())
    text = (headline.ROOT / page).read_text()
    shown = text.split("<!-- results:start -->\n")[1].split("\n<!-- results:end -->")[0]
    assert shown == headline.table(done, headline.choose(done)).strip()
    assert "test, 4x (held out)" in shown and done["test:se:multikey"][0]["split"] == "test"


@pytest.mark.parametrize("cell", ["se", "se-lora"])
def test_a_dev_rerun_multikey_count_and_interval_are_by_prompt_from_its_log(headline, cell):
    """The committed ``dev-rerun:<cell>:multikey`` record against its log read here: hits by ``is_hit`` on the logged
    answers, the interval Wilson by prompt over the logged prompts (three keys each)."""
    from hf_rope_ext.eval import paired, probes

    done = json.loads((headline.RESULTS / "results.json").read_text())
    record = done[f"dev-rerun:{cell}:multikey"][0]
    lines = (headline.RESULTS / f"dev-probes-{cell}.jsonl").read_text().splitlines()
    asked = [json.loads(x)["probes"] for x in lines if "/k3/" in json.loads(x)["prompt_id"]]
    per_prompt = [(sum(probes.is_hit(key, answer) for _, key, answer, _ in keys), len(keys)) for keys in asked]
    assert (record["hits"], record["n"]) == (sum(h for h, _ in per_prompt), sum(n for _, n in per_prompt))
    assert record["interval"] == paired.by_prompt(per_prompt)
    assert record["interval_kind"] == "Wilson by prompt" and "(by prompt)" in headline.dev_shown(record, None)


def test_the_first_rules_note_is_shown_while_a_dev_cell_scored_by_it_is(headline):
    """The note on starred dev cells follows the cells: present with one marked *, absent without."""
    assert headline.notes("x", ["10/10 [0.72, 1.00] *", "-"]).endswith(headline.STARRED)
    assert "marked *" not in headline.notes("x", ["10/10 [0.72, 1.00]", "9/12 [0.50, 1.00] (by prompt)"])
