"""The controls of a long-context probe figure: the test split's paired prompts (another length's keys, objects,
wordings and depths), its chat-template variant, the looser scorer shown beside ``is_hit``, the exact McNemar test
(``test_interval_coverage`` holds the tests and intervals by prompt), and the provenance every probe log line
carries."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hf_rope_ext.cli import main
from hf_rope_ext.eval import chat_form, metadata, paired, probes, splits

LENGTH = 640  # bytes (ByT5 tokens)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the test prompts' hashes before the variants existed: a 32k headline prompt is the prompt it was
BEFORE = {
    ("classic", 640): ["95356c425d006560", "3cb648f46781b17e", "074094d355e49332"],
    ("multikey", 640): ["3794b143901554ed", "38e67d5fa92af120", "2391964462a4f9b4"],
    ("classic", 2560): ["9ed5bb78fad9e0e8", "bd6870ceb2cef49c"],
    ("multikey", 2560): ["5744e40d352caa07", "9d770ba68c4f483d"],
}


@pytest.mark.parametrize("kind, length", sorted(BEFORE))
def test_the_test_prompts_are_unchanged(probe_tokenizer, kind, length):
    chosen = splits.prompts(probe_tokenizer, "test", kind, length, len(BEFORE[kind, length]))
    assert [probes.prompt_sha(p) for p in chosen] == BEFORE[kind, length]
    same = splits.prompts(probe_tokenizer, "test", kind, length, 2, seeds_of=length)  # its own length: itself
    assert [p.prompt_id for p in same] == [p.prompt_id for p in chosen[:2]]


@pytest.mark.parametrize("kind", sorted(splits.KINDS))
def test_a_paired_prompt_is_the_long_prompt_told_in_fewer_tokens(probe_tokenizer, kind):
    """Same keys, questions and depth fractions (to within a filler sentence), less filler, its own id."""
    long = splits.prompts(probe_tokenizer, "test", kind, 4 * LENGTH, 4)
    short = splits.prompts(probe_tokenizer, "test", kind, LENGTH, 4, seeds_of=4 * LENGTH)
    own = splits.prompts(probe_tokenizer, "test", kind, LENGTH, 4)
    sentence = max(len(probe_tokenizer(s, add_special_tokens=False)["input_ids"]) for s in splits.TEST_FILLER)
    for a, b in zip(long, short, strict=True):
        assert [(n.key, n.question) for n in a.needles] == [(n.key, n.question) for n in b.needles]
        room = LENGTH - 40 * len(a.needles)  # filler tokens at the short length, roughly: a sentence's share of it
        assert all(abs(x.depth - y.depth) <= sentence / room for x, y in zip(a.needles, b.needles, strict=True))
        assert (
            LENGTH - sentence <= len(b.ids) <= LENGTH
            and b.prompt_id == a.prompt_id.replace(str(4 * LENGTH), str(LENGTH), 1) + f"/of{4 * LENGTH}"
        )
    assert [n.key for p in own for n in p.needles] != [n.key for p in short for n in p.needles]


def test_a_chat_prompt_is_the_user_turn_and_the_stem_opens_the_assistant_turn(probe_tokenizer, monkeypatch):
    monkeypatch.setattr(probe_tokenizer, "chat_template", CHATML, raising=False)
    plain = splits.prompts(probe_tokenizer, "test", "multikey", LENGTH, 2, seeds_of=2 * LENGTH)
    chat = splits.prompts(probe_tokenizer, "test", "multikey", LENGTH, 2, seeds_of=2 * LENGTH, chat=True)
    for a, b in zip(plain, chat, strict=True):
        text = probe_tokenizer.decode(b.ids)
        assert text.startswith("<|im_start|>user\n" + splits.TEST_TASK) and len(b.ids) <= LENGTH
        assert b.prompt_id == a.prompt_id + "/chat" and [n.key for n in a.needles] == [n.key for n in b.needles]
        for x, y in zip(a.needles, b.needles, strict=True):
            asked, _, stem = x.question.partition("? ")
            assert y.question == f"{asked}?<|im_end|>\n<|im_start|>assistant\n{stem}"


def test_a_chat_prompt_needs_a_template_and_a_stem(probe_tokenizer, monkeypatch):
    monkeypatch.setattr(probe_tokenizer, "chat_template", None, raising=False)
    with pytest.raises(ValueError, match="--chat-template: this model's tokenizer has no chat template"):
        splits.prompts(probe_tokenizer, "test", "classic", LENGTH, 1, chat=True)
    monkeypatch.setattr(probe_tokenizer, "chat_template", CHATML, raising=False)
    with pytest.raises(ValueError, match="expected a question and an answer stem"):
        chat_form.question(probe_tokenizer, " What is it")
    with pytest.raises(ValueError, match="variants of the test split only"):
        splits.prompts(probe_tokenizer, "dev", "classic", LENGTH, 1, seeds_of=2 * LENGTH)


def test_the_looser_scorer_finds_the_key_anywhere_but_not_inside_a_longer_number():
    assert probes.names_key(2619, ": 2619") and not probes.is_hit(2619, ": 2619")
    assert probes.names_key(2619, " the number 2619.") and probes.is_hit(2619, " 2619.")
    assert not probes.names_key(2619, " 26190") and not probes.names_key(2619, " 1.")


@pytest.mark.parametrize("b, c, p", [(1, 9, 0.021484375), (2, 8, 0.109375), (5, 5, 1.0), (0, 0, 1.0), (0, 6, 0.03125)])
def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_keys(b, c, p):
    """Two-sided exact p-values as R's binom.test(b, b + c) gives them."""
    first = [True] * b + [False] * c + [True, False]
    second = [False] * b + [True] * c + [True, False]
    result = paired.mcnemar(first, second)
    assert (result["only_first"], result["only_second"]) == (b, c) and result["p"] == pytest.approx(p)
    assert paired.mcnemar(second, first)["p"] == pytest.approx(p)


def test_provenance_names_the_commit_and_whether_the_tree_was_clean(tmp_path):
    found = metadata.provenance("float32", "cpu")
    root = Path(metadata.__file__).resolve().parent / ".." / ".."
    if (root / ".git").exists():
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert found["commit"] == head.stdout.strip() and isinstance(found["clean"], bool)
    else:
        assert found["commit"] == "unknown" == found["clean"]
    assert (found["dtype"], found["device"]) == ("float32", "cpu") and found["threads"] >= 1


def test_a_tree_without_a_checkout_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(metadata, "__file__", str(tmp_path / "a" / "b" / "metadata.py"))
    assert metadata.checkout_state() == ("unknown", "unknown")
    other = tmp_path / "project"  # a copy of the package inside another project's checkout
    (other / "site" / "hf_rope_ext" / "eval").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    monkeypatch.setattr(metadata, "__file__", str(other / "site" / "hf_rope_ext" / "eval" / "metadata.py"))
    assert metadata.checkout_state() == ("unknown", "unknown")


def test_a_change_makes_the_tree_unclean_but_an_excluded_log_does_not(monkeypatch, tmp_path):
    repo = tmp_path / "checkout"
    (repo / "hf_rope_ext" / "eval").mkdir(parents=True)
    files = [repo / "hf_rope_ext" / "eval" / "metadata.py", repo / "log.jsonl"]
    for path in files:
        path.write_text("x\n")
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(metadata, "__file__", str(files[0]))
    commit, clean = metadata.checkout_state()
    assert len(commit) == 40 and clean is True
    files[1].write_text("y\n")
    assert metadata.checkout_state() == (commit, False)
    assert metadata.checkout_state([files[1]]) == (commit, True)


def test_every_probe_log_line_and_record_carries_its_provenance(probe_llama, tmp_path):
    argv = ["eval", "--model", str(probe_llama), "--probes", "classic", "--split", "test", "--samples", "1"]
    argv += ["--lengths", str(LENGTH), "--seeds-of-length", str(2 * LENGTH), "--no-progress"]
    argv += ["--log", str(tmp_path / "l.jsonl"), "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    line = json.loads((tmp_path / "l.jsonl").read_text())
    data = json.loads((tmp_path / "r.json").read_text())
    assert line["prompt_id"] == f"test/k1/{LENGTH}/0/of{2 * LENGTH}"
    assert line["provenance"] == data["records"][0]["provenance"] == data["metadata"]["provenance"]
    assert set(line["provenance"]) == {"commit", "clean", "dtype", "device", "threads"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--probes", "classic", "--seeds-of-length", "1280"], "--seeds-of-length with --split dev"),
        (["--probes", "classic", "--chat-template"], "--chat-template with --split dev"),
        (["--chat-template"], "--chat-template without --probes"),
        (["--seeds-of-length", "1280"], "--seeds-of-length without --probes"),
    ],
)
def test_the_variants_are_refused_outside_the_test_split(probe_llama, capsys, extra, message):
    assert main(["eval", "--model", str(probe_llama), "--lengths", "128", *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err.strip().splitlines()[-1]
