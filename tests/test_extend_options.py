"""``hf-rope-ext extend`` options for real models: --methods, --dtype, pass keys by generation per prompt."""

from __future__ import annotations

import json

import pytest
from conftest import save_eval_llama

from hf_rope_ext.cli import main

L0 = 400  # bytes: room for a task line and two needles


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_eval_llama(tmp_path_factory.mktemp("tiny_extend_options"), seed=2, max_position_embeddings=L0)


def argv(tiny_dir, out, *more):
    common = ["--data", "python-docs", "--documents", "1", "--last-chunk", "0", "--passkey-depths", "0"]
    return ["extend", "--model", str(tiny_dir), *common, "--factors", "2", "--report-dir", str(out), *more]


def test_methods_dtype_and_pass_keys_by_prompt_reach_the_report(tiny_dir, tmp_path, capsys):
    out = tmp_path / "report"
    more = ["--methods", "none,rerope", "--dtype", "bfloat16", "--passkey-prompts", "1", "--passkey-keys", "2"]
    assert main(argv(tiny_dir, out, *more, "--rope-param", "window=16", "--no-progress")) == 0
    records = json.loads((out / "report.json").read_text())["records"]
    assert {r["rope_type"] for r in records} == {"none", "rerope"}
    keyed = [r for r in records if "multikey_accuracy" in r]
    assert {(r["rope_type"], r["length"]) for r in keyed} == {(m, n) for m in ("none", "rerope") for n in (L0, 2 * L0)}
    assert all(r["multikey_probes"] == 2 for r in keyed)
    text = (out / "report.md").read_text()
    assert "Pass keys by greedy generation (1 prompts x 2 keys per cell" in text
    assert "dtype bfloat16, peak resident memory" in text
    assert "--methods none,rerope" in text and "--dtype bfloat16" in text and "--passkey-keys 2" in text
    assert "peak resident memory" in capsys.readouterr().out


def test_methods_and_rope_type_together_are_refused_by_name(tiny_dir, tmp_path, capsys):
    assert main(argv(tiny_dir, tmp_path / "r", "--methods", "none,yarn", "--rope-type", "yarn")) == 2
    assert "--methods and --rope-type: give one of them" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_an_unknown_method_is_named_before_any_run(tiny_dir, tmp_path, capsys):
    assert main(argv(tiny_dir, tmp_path / "r", "--methods", "none,yarm")) == 2
    assert "yarm" in capsys.readouterr().err


def parsed(*words):
    from hf_rope_ext.cli import build_parser

    return build_parser().parse_args(["extend", *words])


def test_a_long_model_gets_bounded_defaults_and_keeps_what_was_given():
    from hf_rope_ext.cli.extend import fill_defaults

    args = parsed("--documents", "2", "--dtype", "float32")
    fill_defaults(args, 8192)
    assert (args.factors, args.documents, args.last_chunk, args.passkey_depths) == ([2.0, 4.0], 2, 0, 0)
    assert (args.passkey_prompts, args.far_stride, args.data, args.dtype) == (1, 1024, ["python-docs"], "float32")
    args = parsed()
    fill_defaults(args, 512)  # the bundled model: the defaults its README figures were measured with
    assert (args.factors, args.documents, args.last_chunk, args.passkey_depths) == ([2.0, 4.0, 8.0], 3, 128, 5)
    assert (args.passkey_prompts, args.far_stride, args.data, args.dtype) == (0, 16, None, "float32")
