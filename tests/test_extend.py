"""``hf-rope-ext extend``: method discovery, default parameters, the comparison and saving a patched model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction

import pytest
import torch
from conftest import EVAL_L0 as L0
from conftest import eval_llama_config, save_eval_llama

from hf_rope_ext.attention.methods import self_extend
from hf_rope_ext.attention.methods.params import FAR_WINDOW_FRACTION
from hf_rope_ext.cli import main
from hf_rope_ext.eval import compare, load_model
from hf_rope_ext.eval.runner import EvalPlan
from hf_rope_ext.types import registry


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_eval_llama(tmp_path_factory.mktemp("tiny_extend"), seed=1)


def test_applicable_methods_come_from_the_registry():
    found = compare.applicable_methods(eval_llama_config())
    expected = [m.name for m in registry.methods() if m.training_free]
    assert found == [None, "linear", "dynamic", "yarn", *expected]
    assert not {m.name for m in registry.methods() if not m.training_free} & set(found[1:])


@pytest.mark.parametrize("factor", [2.0, 3.0, 4.0, 8.0, 16.0])
def test_default_parameters_fit_the_target_length_into_the_pretrained_distances(factor):
    window = L0 // FAR_WINDOW_FRACTION
    for method in registry.methods():
        params = compare.default_parameters(method.name, L0, factor)
        if "group_size" in params:  # self-extend: its authors' rule, checked below
            assert params == self_extend.authors_defaults(factor, L0)
        elif "window" in params and "factor" in params:  # leaky ReRoPE: the farthest distance lands on L0 exactly
            assert window + (factor * L0 - window) / params["factor"] == pytest.approx(L0)
        if "chunk_size" in params:  # Dual Chunk Attention: its authors' 3/4 L0 and L0/16
            assert params == {"chunk_size": 3 * L0 // 4, "local_size": L0 // 16}
        elif "local_window" in params:  # STRING: its authors' S = L0/3, W = 128 (at most S/2 for a short L0) ...
            assert params["window"] == L0 // 3 and params["local_window"] == min(128, L0 // 6)
            reach = factor * L0 - params["window"] + params["local_window"]  # ... and frequencies for the rest
            assert (
                params["frequencies"] == "ntk_by_parts" and reach / L0 <= params["frequency_factor"] < reach / L0 + 0.01
            )
        elif "window" in params:
            assert params["window"] == window


def test_a_method_declares_its_own_defaults(monkeypatch):
    """A new type's ``defaults`` hook is what extend and finetune use, at each factor; none: nothing of its own."""
    rerope = registry.get_method("rerope")
    hook = lambda pretrain, factor: {"window": pretrain // 2 + int(factor or 0)}  # noqa: E731
    monkeypatch.setitem(registry._METHODS, "test_half", registry.RopeMethod(**{**vars(rerope), "name": "test_half",
                                                                               "defaults": hook}))  # fmt: skip
    monkeypatch.setitem(registry._METHODS, "test_none", registry.RopeMethod(**{**vars(rerope), "name": "test_none",
                                                                               "defaults": None}))  # fmt: skip
    assert compare.default_parameters("test_half", L0, 4.0) == {"window": L0 // 2 + 4}
    assert compare.default_parameters("test_half", L0, None) == {"window": L0 // 2}
    assert compare.default_parameters("test_none", L0, 4.0) == {} == compare.default_parameters("yarn", L0, 4.0)


@pytest.mark.parametrize("pretrained", [64, 4096, 8192, 131072])
@pytest.mark.parametrize("factor", [1.0, 1.5, 2.0, 4.0, 8.0, 16.0])
def test_self_extend_defaults_follow_the_authors_rule(factor, pretrained):
    """LongLM's README: (1/2 ~ 2/3) L0 > W + (N - W)/G; here W = L0/4 and the smallest G with at most 2/3 L0."""
    params = self_extend.authors_defaults(factor, pretrained)
    w, g, n = params["window"], params["group_size"], Fraction(factor) * pretrained
    farthest = lambda group: w + (n - w) / group  # noqa: E731  (the largest distance beyond the window, exact)
    assert w == pretrained // 4
    assert farthest(g) <= Fraction(2, 3) * pretrained
    assert g == 1 or farthest(g - 1) > Fraction(2, 3) * pretrained


def test_self_extend_defaults_at_4k_and_8k():
    """Worked values: a 4k model at 4x (16k) gets window 1024 and groups of 9; an 8k one at 2x groups of 5."""
    assert self_extend.authors_defaults(4.0, 4096) == {"window": 1024, "group_size": 9}
    assert self_extend.authors_defaults(2.0, 8192) == {"window": 2048, "group_size": 5}


def test_method_runs_pair_each_factor_with_its_length():
    assert compare.method_runs("yarn", 512, [4.0, 2.0]) == [(2.0, [512, 1024]), (4.0, [2048])]
    assert compare.method_runs(None, 512, [2.0, 4.0]) == [(None, [512, 1024, 2048])]
    assert compare.method_runs("dynamic_yarn", 512, [2.0]) == [(None, [512, 1024])]


def test_a_type_whose_defaults_follow_the_factor_gets_a_model_per_factor():
    """STRING alone reaches 1.3x; at 2x and 4x its defaults put a frequency type underneath at a factor of its own,
    so the 4x cell must not read 2048 tokens with the 2x model (or with none underneath). Dual Chunk Attention's
    defaults do not depend on the factor: one model serves every length."""
    runs = compare.method_runs("string", L0, [4.0, 2.0])
    assert runs == [(2.0, [L0, 2 * L0]), (4.0, [4 * L0])]
    config = eval_llama_config()
    underneath = [compare.run_parameters(config, "string", s, L0).get("frequency_factor") for s, _ in runs]
    assert underneath[0] is not None and underneath[1] > underneath[0]
    assert compare.method_runs("string", L0, [2.0]) == [(2.0, [L0, 2 * L0])]  # one factor: still its own model
    assert compare.method_runs("self_extend", 512, [2.0, 4.0]) == [(2.0, [512, 1024]), (4.0, [2048])]
    assert compare.method_runs("dual_chunk", 512, [2.0, 4.0]) == [(None, [512, 1024, 2048])]


@pytest.fixture(scope="module")
def comparison(tiny_dir, docs_dir):
    plan = EvalPlan(lengths=(2,), documents=2, last_chunk=16, passkey_depths=0)
    return compare.run_comparison(tiny_dir, None, (2.0, 4.0), plan, docs_dir, progress=False)


def test_comparison_covers_every_method_and_length(comparison):
    methods = ["none" if m is None else m for m in compare.applicable_methods(eval_llama_config())]
    measured = {(r["rope_type"], r["length"]) for r in comparison if "perplexity" in r}
    assert measured == {(m, n) for m in methods for n in (L0, 2 * L0, 4 * L0)}
    assert all(math.isfinite(r["perplexity"]) for r in comparison if "perplexity" in r)
    chunked = {(r["rope_type"], r["length"]) for r in comparison if "last_chunk_loss" in r}
    assert chunked == measured


def test_dynamic_types_equal_the_unscaled_model_inside_the_pretraining_length(comparison):
    at_l0 = {r["rope_type"]: r["perplexity"] for r in comparison if r["length"] == L0 and "perplexity" in r}
    assert at_l0["dynamic"] == pytest.approx(at_l0["none"], rel=1e-6)
    assert at_l0["dynamic_yarn"] == pytest.approx(at_l0["none"], rel=1e-6)
    assert at_l0["linear"] != pytest.approx(at_l0["none"], rel=1e-6)  # a static scaling does change it


def test_unknown_rope_type_fails_before_any_evaluation(tiny_dir, docs_dir):
    with pytest.raises(KeyError, match="no_such"):
        compare.run_comparison(tiny_dir, [None, "no_such"], (2.0,), None, docs_dir, progress=False)


def test_extend_out_saves_a_model_that_reloads_to_the_same_logits(tiny_dir, docs_dir, tmp_path, capsys):
    out = tmp_path / "extended"
    argv = [
        "extend",
        "--model",
        str(tiny_dir),
        "--rope-type",
        "ntk_by_parts",
        "--factor",
        "2",
        "--out",
        str(out),
        "--data",
        str(docs_dir),
        "--documents",
        "1",
        "--passkey-depths",
        "0",
        "--last-chunk",
        "16",
        "--no-progress",
    ]
    assert main(argv) == 0
    saved = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert saved["rope_type"] == "ntk_by_parts" and saved["factor"] == 2.0
    assert saved["original_max_position_embeddings"] == L0
    ids = torch.arange(3, 3 + 2 * L0)[None]
    with torch.no_grad():
        expected = load_model(tiny_dir, saved)(ids).logits
        torch.testing.assert_close(load_model(out)(ids).logits, expected, rtol=0, atol=0)
    records = json.loads((out / "report.json").read_text())["records"]
    assert {r["rope_type"] for r in records} == {"none", "ntk_by_parts"}
    assert (out / "perplexity.png").is_file() and "ntk_by_parts" in (out / "README.md").read_text()
    assert "| ntk_by_parts |" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(argv) == 2  # never overwrites without --overwrite
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nonexistent/model"], "not a model directory"),
        (["--rope-type", "bogus"], "bogus"),
        (["--out", "somewhere"], "--rope-type"),
        (["--rope-type", "yarn", "--rope-param", "nope=1"], "['nope']=1 is not a parameter of rope_type='yarn'"),
    ],
)
def test_extend_bad_input(tiny_dir, docs_dir, tmp_path, args, message, capsys):
    base = [
        "extend",
        "--model",
        str(tiny_dir),
        "--data",
        str(docs_dir),
        "--report-dir",
        str(tmp_path / "r"),
        "--factors",
        "2",
    ]
    assert main(base + args + ["--no-progress"]) == 2
    assert message in capsys.readouterr().err


STOCK_LOAD = """
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
assert "hf_rope_ext" not in sys.modules
config = AutoConfig.from_pretrained(sys.argv[1])
ids = torch.arange(3, 3 + 4 * {L0})[None]
with torch.no_grad():
    logits = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()(ids).logits
print(json.dumps({{"max_position_embeddings": config.max_position_embeddings, "logits": logits.sum().item()}}))
"""


@pytest.mark.parametrize(
    ("rope_type", "max_positions", "original"),
    [("yarn", 4 * L0, L0), ("ntk", 4 * L0, L0), ("linear", 4 * L0, None), ("dynamic", L0, None)],
)
def test_the_saved_config_states_the_extended_length(tiny_dir, docs_dir, tmp_path, rope_type, max_positions, original):
    """max_position_embeddings is what transformers, vLLM and TGI read as the model's context: the extended length
    (transformers' dynamic reads it as L0), with L0 in rope_parameters where the type has a key for it; the package
    reads L0 back, and the saved model gives the logits of the model it evaluated."""
    from transformers import AutoConfig

    from hf_rope_ext.types.rope_parameters import pretraining_length

    out = tmp_path / "out"
    argv = ["extend", "--model", str(tiny_dir), "--rope-type", rope_type, "--factor", "4", "--out", str(out)]
    argv += ["--data", str(docs_dir), "--documents", "1", "--passkey-depths", "0", "--last-chunk", "16"]
    assert main([*argv, "--no-progress"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["max_position_embeddings"] == max_positions
    assert saved["rope_parameters"].get("original_max_position_embeddings") == original
    assert pretraining_length(AutoConfig.from_pretrained(out)) == L0
    ids = torch.arange(3, 3 + 4 * L0)[None]
    with torch.no_grad():
        expected = load_model(tiny_dir, saved["rope_parameters"])(ids).logits
        torch.testing.assert_close(load_model(out)(ids).logits, expected, rtol=0, atol=0)
    if rope_type == "yarn":  # a type stock transformers knows: loaded by it alone, to the same logits
        stock = subprocess.run(
            [sys.executable, "-c", STOCK_LOAD.format(L0=L0), str(out)], capture_output=True, text=True, check=True
        )
        read = json.loads(stock.stdout.strip().splitlines()[-1])
        assert read["max_position_embeddings"] == 4 * L0
        assert read["logits"] == pytest.approx(expected.sum().item(), rel=1e-6)
