"""The pass-key probes of ``hf-rope-ext eval --probes`` (``eval.splits``, ``eval.probes``, ``eval.intervals``): the
dev split is the probe every earlier figure used, the test split shares nothing with it nor with the retrieval rows
the package trains on, every score carries its count and Wilson interval, and a stopped run resumes."""

from __future__ import annotations

import json
import re

import pytest

from hf_rope_ext.cli import main
from hf_rope_ext.eval import intervals, multikey, probes, splits
from hf_rope_ext.eval.adapters import training_command
from hf_rope_ext.eval.loading import load_model
from hf_rope_ext.store.bundled import corpus_files
from hf_rope_ext.train import retrieval

LENGTH = 640  # bytes (ByT5 tokens): ten times the tiny model's 64 positions


@pytest.mark.parametrize(
    "hits, n, lo, hi",
    [
        (10, 10, 0.7225, 1.0),
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (9, 12, 0.4677, 0.9111),
        (30, 30, 0.8865, 1),
    ],
)
def test_wilson_intervals_match_published_values(hits, n, lo, hi):
    """Wilson 95% score intervals as tabulated (Newcombe 1998, Table I, and R's prop.test without correction)."""
    assert intervals.wilson(hits, n) == pytest.approx((lo, hi), abs=1e-4)


def test_a_target_is_met_only_when_the_lower_bound_clears_it():
    record = intervals.score(10, 10)
    assert intervals.shown(record) == "10/10 [0.72, 1.00]"
    assert intervals.verdict(record, 0.7) == "met"
    assert intervals.verdict(record, 0.8) == "not shown at this sample size"
    assert intervals.verdict(intervals.score(1, 10), 0.8) == "missed"
    with pytest.raises(ValueError, match="hits=11, n=10"):
        intervals.wilson(11, 10)


def test_the_dev_split_is_the_probe_of_every_earlier_figure(probe_tokenizer):
    """Dev prompt p of P: the keys ``passkeys(P k, seed 0)`` in order, the regular grid of depths, the dev objects and
    question, built by ``multikey.prompt_ids`` exactly as the earlier cells built them."""
    for kind, k in splits.KINDS.items():
        chosen = splits.prompts(probe_tokenizer, "dev", kind, LENGTH, 4)
        keys = multikey.prompt_keys(4, k, 0)
        for p, prompt in enumerate(chosen):
            assert prompt.ids == multikey.prompt_ids(probe_tokenizer, LENGTH, keys[p], multikey.depths(k, p, 4))
            assert [n.key for n in prompt.needles] == keys[p]
            assert [n.question for n in prompt.needles] == [
                multikey.QUESTION.format(name=name) for name in multikey.OBJECTS[:k]
            ]


@pytest.mark.parametrize("kind", sorted(splits.KINDS))
def test_a_test_prompt_plants_each_key_once_in_its_slot_and_asks_about_it(probe_tokenizer, kind):
    k = splits.KINDS[kind]
    for p in range(6):
        prompt = splits.test_prompt(probe_tokenizer, k, LENGTH, p)
        text = probe_tokenizer.decode(prompt.ids)
        longest = max(len(probe_tokenizer(s, add_special_tokens=False)["input_ids"]) for s in splits.TEST_FILLER)
        assert LENGTH - longest < len(prompt.ids) <= LENGTH
        assert [text.count(str(n.key)) for n in prompt.needles] == [1] * k
        assert [text.index(str(n.key)) for n in prompt.needles] == sorted(
            text.index(str(n.key)) for n in prompt.needles
        )
        for i, needle in enumerate(prompt.needles):
            low, high = splits.TEST_DIGITS
            assert low <= len(str(needle.key)) <= high
            assert i / k - 0.1 <= needle.depth <= (i + 1) / k + 0.1  # its slot, give or take the nearest boundary
            name = next(o for o in splits.TEST_OBJECTS if o in needle.question)
            planted = [w[0].format(name=name, key=needle.key) for w in splits.TEST_WORDINGS]
            assert sum(t.strip() in text for t in planted) == 1  # its own wording, naming the object asked about


def test_a_test_prompt_depends_on_its_index_alone(probe_tokenizer):
    """Prompt p is the same whether 3 or 30 are asked (a run can be extended or resumed), and prompts differ."""
    few = splits.prompts(probe_tokenizer, "test", "classic", LENGTH, 3)
    many = splits.prompts(probe_tokenizer, "test", "classic", LENGTH, 8)
    assert few == many[:3]
    assert len({tuple(p.ids) for p in many}) == 8 and len({p.needles[0].key for p in many}) == 8


def words(text: str) -> list[str]:
    """Lower-case words, every number and template field one word "#"."""
    return re.sub(r"\{\w+\}|\d+", " # ", text.lower()).replace("?", " ").replace(".", " ").replace(",", " ").split()


def grams(texts, n: int = 4) -> set[tuple[str, ...]]:
    return {tuple(w[i : i + n]) for t in texts for w in [words(t)] for i in range(len(w) - n + 1)}


def split_texts(split: str) -> list[str]:
    """Every sentence a split's prompts and questions are made of (templates, objects filled in)."""
    if split == "dev":
        from hf_rope_ext.eval.passkey import FILLER, TASK

        templates = [multikey.NEEDLE, multikey.QUESTION]
        return [TASK, *FILLER, *(t.format(name=o, key=0) for t in templates for o in multikey.OBJECTS)]
    templates = [t for pair in splits.TEST_WORDINGS for t in pair]
    return [
        splits.TEST_TASK,
        *splits.TEST_FILLER,
        *(t.format(name=o, key=0) for t in templates for o in splits.TEST_OBJECTS),
    ]


def retrieval_texts() -> list[str]:
    """Every fact and question the retrieval rows can hold (``train.retrieval``), each kind about each place."""
    templates = [*retrieval.FACTS, *retrieval.QUESTIONS]
    return [t.format(kind=k, thing=p, value=0) for t in templates for k in retrieval.KINDS for p in retrieval.THINGS]


@pytest.mark.parametrize("split", splits.SPLITS)
def test_no_split_shares_four_words_in_a_row_with_the_retrieval_rows(split):
    assert not grams(split_texts(split)) & grams(retrieval_texts())


def test_the_splits_share_no_sentence_and_no_four_words_in_a_row():
    assert not grams(split_texts("dev")) & grams(split_texts("test"))


def test_no_sentence_of_a_split_is_in_the_text_the_retrieval_rows_are_cut_from():
    """The training text of ``finetune`` (the bundled corpus's training split) holds none of the splits' sentences."""
    corpus = " ".join(path.read_text(encoding="utf-8", errors="replace") for path in corpus_files("train"))
    found = [s.strip() for split in splits.SPLITS for s in split_texts(split) if s.strip() in corpus]
    assert not found


def test_a_hit_is_the_key_and_no_more_digits():
    assert probes.is_hit(48213, " 48213. The") and probes.is_hit(48213, "48213")
    assert (
        not probes.is_hit(48213, " 482130") and not probes.is_hit(48213, " 4821") and not probes.is_hit(48213, " the")
    )
    assert probes.answer_tokens(4821) == 6


def test_a_run_resumes_where_its_log_stops_and_ignores_other_cells(probe_llama, probe_tokenizer, tmp_path, monkeypatch):
    """Every answered prompt is logged at once; a second run asks only what the log lacks, a run of another cell or
    with another prompt under the same id asks again, and the record counts every probe of the run."""
    model = load_model(probe_llama)
    asked = []
    read = probes.read_prompts

    def counting(model, tokenizer, prompts, questions, bar_of, done=None):
        asked.append(len(prompts))
        return read(model, tokenizer, prompts, questions, bar_of, done)

    monkeypatch.setattr(probes, "read_prompts", counting)
    log = probes.ProbeLog(tmp_path / "log.jsonl", {"model": "a"})
    first = probes.run_probes(model, probe_tokenizer, "test", "multikey", LENGTH, 2, log, progress=False)
    again = probes.run_probes(model, probe_tokenizer, "test", "multikey", LENGTH, 3, log, progress=False)
    other = probes.run_probes(
        model, probe_tokenizer, "test", "multikey", LENGTH, 1, probes.ProbeLog(log.path, {"model": "b"})
    )
    assert asked == [2, 1, 1]
    assert (first["n"], again["n"], other["n"]) == (6, 9, 3)
    assert again["by_depth"][:0] == [] and again["hits"] >= first["hits"] and again["split"] == "test"
    lines = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert [line["cell"]["model"] for line in lines] == ["a", "a", "a", "b"]
    lo, hi = intervals.wilson(again["hits"], 9)
    assert again["interval"] == [round(lo, 4), round(hi, 4)]
    monkeypatch.setattr(splits, "TEST_TASK", splits.TEST_TASK + " Take care.")  # the same ids, other prompts
    probes.run_probes(model, probe_tokenizer, "test", "multikey", LENGTH, 3, log, progress=False)
    assert asked[-1] == 3


def test_the_record_scores_the_answers_by_the_rule_of_this_version(probe_tokenizer, monkeypatch):
    """Hits are counted from the logged answers (a logged verdict is not trusted), misses named with their answer."""
    chosen = splits.prompts(probe_tokenizer, "dev", "classic", LENGTH, 2)
    per_prompt = [
        [[0.25, chosen[0].needles[0].key, f" {chosen[0].needles[0].key}.", False]],
        [[0.75, 123, " 1234", True]],
    ]
    record = probes.aggregate("dev", "classic", LENGTH, per_prompt, [LENGTH, LENGTH])
    assert (record["hits"], record["n"]) == (1, 2)
    assert record["misses"] == [[0.75, 123, " 1234"]] and record["by_depth"] == [[0.25, 1.0], [0.75, 0.0]]


def test_eval_probes_writes_counts_intervals_a_plot_and_a_log(probe_llama, tmp_path, capsys):
    argv = ["eval", "--model", str(probe_llama), "--probes", "classic,multikey", "--split", "test", "--samples", "2"]
    argv += ["--lengths", "640,1280", "--no-progress", "--rope-type", "rerope", "--rope-param", "window=16"]
    out = [f"--{flag}={tmp_path / name}" for flag, name in (("json", "r.json"), ("plot", "r.png"), ("log", "l.jsonl"))]
    assert main([*argv, *out]) == 0
    table = capsys.readouterr().out
    assert re.search(r"\| rerope \| test \| classic \| \d/2 \[0\.\d\d, \d\.\d\d\] \| \d/2 \[", table), table
    assert re.search(r"\| rerope \| test \| multikey \| \d/6 \[", table), table
    data = json.loads((tmp_path / "r.json").read_text())
    records = data["records"]
    assert [(r["probe"], r["length"], r["n"]) for r in records] == [
        ("classic", 640, 2),
        ("classic", 1280, 2),
        ("multikey", 640, 6),
        ("multikey", 1280, 6),
    ]
    assert all(r["split"] == "test" and r["rope_parameters"]["window"] == 16 for r in records)
    assert data["metadata"]["model_sha256"] == records[0]["model_sha256"]
    assert (tmp_path / "r.png").stat().st_size > 0 and len((tmp_path / "l.jsonl").read_text().splitlines()) == 8


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--probes", "classic", "--split", "train"], "--split 'train': allowed dev, test"),
        (["--probes", "classic,passkey"], "--probes 'passkey': allowed classic, multikey"),
        (["--samples", "3"], "--samples without --probes"),
        (["--split", "test"], "--split without --probes"),
        (["--probes", "classic", "--ruler"], "--probes with --ruler"),
    ],
)
def test_bad_probe_flags_are_refused_by_name(probe_llama, capsys, extra, message):
    assert main(["eval", "--model", str(probe_llama), "--lengths", "128", *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err.strip().splitlines()[-1]


def test_the_training_command_of_an_adapter_is_read_from_its_card(tmp_path):
    (tmp_path / "README.md").write_text(
        "Trained by `hf-rope-ext finetune --rope-type x` (prose).\n\n```bash\n"
        "hf-rope-ext finetune --model M \\\n    --rope-type x --max-steps 3\n```\n"
    )
    assert training_command(tmp_path) == "hf-rope-ext finetune --model M --rope-type x --max-steps 3"
    (tmp_path / "README.md").write_text("no command\n")
    assert training_command(tmp_path) is None


def test_tables_print_every_score_with_its_count_and_interval():
    """The default measures' records carry hits and a Wilson interval beside each accuracy, and the tables show
    ``hits/n [lo, hi]`` (a record without the count keeps its number)."""
    from hf_rope_ext.eval import report

    scored = {"rope_type": "yarn", "length": 1024, "passkey_accuracy": 0.6, "passkey_samples": 5, "passkey_hits": 3}
    scored["passkey_interval"] = intervals.score(3, 5)["interval"]
    bare = {"rope_type": "none", "length": 1024, "passkey_accuracy": 1.0}
    table = report.markdown_table([scored, bare], ["rope_type", "passkey_accuracy"])
    assert "| yarn | 3/5 [0.23, 0.88] |" in table and "| none | 1 |" in table
    assert "| yarn | 3/5 [0.23, 0.88] |" in report.pivot_table([scored, bare], "passkey_accuracy")
