"""``hf-rope-ext eval --sequence-parallel N`` under torchrun: each row split over the N CPU processes (gloo) gives the
records one process gives (perplexity, last-chunk loss, teacher-forced passkey) within fp32 rounding, for an
attention-level and a frequency-level type; the first process alone writes them; what the split cannot run is
refused by name."""

import json

import pytest
from finetune_launch import base_and_text, torchrun

from hf_rope_ext.cli import main

LENGTHS = "256,512"  # the byte tokenizer's passkey prompts need 251 tokens
FIGURES = ("perplexity", "last_chunk_loss", "passkey_accuracy")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return base_and_text(tmp_path_factory.mktemp("eval-split"))


def words(setup, out, rope: list[str]) -> list[str]:
    base = ["eval", "--model", str(setup / "base"), "--data", str(setup / "data"), "--lengths", LENGTHS]
    return [*base, *rope, "--documents", "2", "--passkey-depths", "2", "--no-generate", "--json", str(out)]


@pytest.mark.parametrize(
    "rope",
    [
        ["--rope-type", "self_extend", "--rope-param", "window=16", "--rope-param", "group_size=8"],
        ["--rope-type", "yarn", "--factor", "8"],
    ],
)
def test_a_split_evaluation_gives_the_one_process_records(setup, tmp_path, rope):
    assert main(words(setup, tmp_path / "one.json", rope)) == 0
    done = torchrun(["-m", "hf_rope_ext", *words(setup, tmp_path / "two.json", rope), "--sequence-parallel", "2"])
    assert done.stdout.count("| ") >= 3  # one table, from the first process
    one, two = (json.loads((tmp_path / f"{n}.json").read_text())["records"] for n in ("one", "two"))
    assert [r["length"] for r in one] == [r["length"] for r in two] == [256, 512]
    assert [(r["sequence_parallel"], r["shard_tokens"]) for r in two] == [(2, 128), (2, 256)]  # read split
    for x, y in zip(one, two, strict=True):
        assert [x[f] for f in FIGURES] == [pytest.approx(y[f], rel=1e-5) for f in FIGURES], (x, y)


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "passkey by generation (add --no-generate) generates token by token"),
        (["--no-generate", "--needle", "x.png"], "--needle generates token by token"),
        (["--no-generate"], "runs under torchrun --nproc_per_node 2 (this run has 1 process(es))"),
    ],
)
def test_what_a_split_evaluation_cannot_run_is_refused(setup, capsys, extra, message):
    argv = ["eval", "--model", str(setup / "base"), "--lengths", LENGTHS, "--sequence-parallel", "2", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_length_that_does_not_split_is_refused(setup, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["eval", "--model", str(setup / "base"), "--lengths", "256,511", "--sequence-parallel", "2"]
    assert main([*argv, "--no-generate"]) == 2
    assert "a row of 511 tokens does not split into 2" in capsys.readouterr().err
