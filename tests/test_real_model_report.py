"""experiments/real_model_report.py (and experiments/ruler_report.py): a cell run with ``--rope-param`` is stored
beside the one with the defaults, its row says which values it ran with, and its command gives them back."""

import json
import shlex
from pathlib import Path

import pytest
import torch
from conftest import load_script

from hf_rope_ext.eval import compare, loading
from hf_rope_ext.eval.adapters import adapter_label

ROOT = Path(__file__).resolve().parents[1]
CHOSEN = {"window": 8192, "local_window": 128, "frequencies": "plain", "frequency_factor": None}


@pytest.fixture(scope="module")
def script():
    return load_script("real_model_report")


def test_a_cell_with_parameters_has_a_key_of_its_own(script):
    adapter = script.ADAPTER
    assert script.stored_key("string:2", adapter, "float32", {}) == "string:2 float32"
    key = script.stored_key("string:2:1key", adapter, "float32", CHOSEN)
    assert key == "string:2:1key[window=8192,local_window=128,frequencies=plain,frequency_factor=None] float32"
    # a lora cell names its adapter, the default one too: the key the shipped adapter's records are stored under
    assert script.stored_key("lora:4", adapter, "float32", {}) == "lora@smollm2-self-extend-retrieval-lora:4 float32"
    stored = json.loads((ROOT / "docs" / "results" / "real-model" / "results.json").read_text())
    assert script.stored_key("lora:4:1key", adapter, "float32", {}) in stored


def test_the_parameters_go_over_the_defaults_and_into_the_row(script):
    rope_type, extra, name = script.split_method("string+constant", 2, CHOSEN)
    assert rope_type == "string" and extra == {"attention_temperature": "constant", "temperature_factor": 2.0, **CHOSEN}
    assert name.endswith(" window=8192 local_window=128 frequencies=plain frequency_factor=None")
    config = loading.load_config(ROOT / "examples" / "smollm2-self-extend-retrieval-lora")
    params = compare.run_parameters(config, rope_type, 2.0, 8192, extra)
    assert params["window"] == 8192 and params["frequencies"] == "plain" and "frequency_factor" not in params
    assert compare.run_parameters(config, rope_type, 2.0, 8192, {})["frequencies"] == "ntk_by_parts"


def test_the_command_gives_the_parameters_back():
    words = shlex.split(loading.rope_param_flags(CHOSEN))
    assert loading.parse_rope_params(words[1::2]) == CHOSEN


def test_a_lora_row_names_the_rope_type_its_adapter_was_trained_under(script, tmp_path):
    assert adapter_label(script.ADAPTER) == "self_extend + LoRA smollm2-self-extend-retrieval-lora"
    adapter = tmp_path / "smollm2-dual-chunk-lora"
    adapter.mkdir()
    params = {"rope_type": "dual_chunk", "chunk_size": 6144, "local_size": 512}
    (adapter / "config.json").write_text(json.dumps({"rope_parameters": params}))
    assert adapter_label(adapter) == "dual_chunk + LoRA smollm2-dual-chunk-lora"


def test_a_lora_cell_merges_once_per_adapter_weights(script, tmp_path, monkeypatch):
    """The merged model is the adapter on its base (same logits), reused while the weights stay, merged anew (its
    own folder) when the adapter is retrained under the same name, and no half-written folder is left behind."""
    from conftest import save_byte_llama
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from hf_rope_ext.store import from_gguf

    monkeypatch.setattr(from_gguf, "cache_root", lambda: tmp_path / "cache")
    base = save_byte_llama(tmp_path / "base", 64)
    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora)
    peft.save_pretrained(adapter)
    peft.base_model.model.config.save_pretrained(adapter)
    first = script.merged(adapter, base)
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(first)(ids).logits, peft(ids).logits)
    assert script.merged(adapter, base) == first
    torch.manual_seed(1)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(adapter)
    second = script.merged(adapter, base)
    assert second != first and second.name.startswith("adapter-")
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, second.name])


def test_a_single_key_cell_command_keeps_its_flags_before_the_comment(script):
    command = script.single_command(("lora", 4, 10), "float32", {"window": 8192}, script.ADAPTER)
    words = shlex.split(command, comments=True)
    assert words[-4:] == ["--rope-param", "window=8192", "--adapter", "examples/smollm2-self-extend-retrieval-lora"]
    assert command.endswith("  # 10 keys")


def test_every_cell_asks_as_many_probes_as_the_issue_sets(script):
    """Three-key cells: 7 prompts (21 probes) at 2x, 4 (12) at 4x; classic cells: 10 prompts of one key."""
    assert {(factor, prompts) for _, factor, prompts in script.CELLS} == {(2, 7), (4, 4)}
    assert {prompts for _, _, prompts in script.SINGLE} == {10}


def test_a_ruler_cell_key_and_command_give_its_parameters_back():
    """experiments/ruler_report.py: a cell with --rope-param values has its own key, and the ``hf-rope-ext eval``
    command stored with it sets the type, the factor and every parameter the cell ran with (the record's saved keys
    aside)."""
    from argparse import Namespace

    ruler = load_script("ruler_report")
    args = Namespace(tasks="niah_single_1", adapter=ruler.ADAPTER, chosen={"attention_temperature": "log"})
    args.__dict__ |= {"dtype": "float32", "max_gen_toks": 32, "limit": 3}
    key = ruler.cell_key("dual_chunk:4:32768", args)
    assert key == "dual_chunk:4:32768:niah_single_1[attention_temperature=log] float32 gen32"
    params = {"rope_type": "dual_chunk", "factor": 4.0, "rope_theta": 1e5, "chunk_size": 6144, "local_size": 512}
    words = shlex.split(ruler.command("dual_chunk:4:32768", args, {**params, "attention_temperature": "log"}))
    flags = dict(zip(words[::2], words[1::2], strict=False))
    assert words[:5] == ["hf-rope-ext", "eval", "--model", "<smollm2>", "--ruler"]
    assert flags["--rope-type"] == "dual_chunk" and flags["--factor"] == "4" and flags["--lengths"] == "32768"
    chosen = loading.parse_rope_params([words[i + 1] for i, w in enumerate(words) if w == "--rope-param"])
    assert chosen == {"chunk_size": 6144, "local_size": 512, "attention_temperature": "log"}
    assert (flags["--limit"], flags["--dtype"], flags["--max-gen-toks"]) == ("3", "float32", "32")


@pytest.mark.parametrize(
    "answer, kind",
    [
        (": 8734194.", "asked"),
        (" 7771611. What is", "another needle"),  # a value planted for another key
        (": 7771612", "needle copied wrong"),  # its first four digits, not its value
        (" 1234567", "other number"),
        (" 77716110", "needle copied wrong"),  # 8 digits: not the 7-digit 7771611, a copy of it
        (" the number of the", "no number"),
        (" 2345678", "other number"),  # it sits inside the prompt's 123456789, no 7-digit value of the prompt
    ],
)
def test_a_ruler_answer_is_sorted_by_where_its_number_comes_from(answer, kind):
    """experiments/ruler_answers.py: an answer's first number against the value asked and the prompt's other values
    (a 7-digit run inside a longer number is no value of the prompt)."""
    answers = load_script("ruler_answers")
    prompt = "One of the special magic numbers for apple is: 7771611. ... for pear is: 8734194. Page 123456789."
    assert answers.source(answer, ["8734194"], prompt) == kind


@pytest.mark.parametrize(
    "answer, asked, kind",
    [
        (" 46866", 65683, "key nearer the question"),  # planted after the key asked
        (" 46044", 68239, "key farther back"),
        (" 24933.", 46044, "key nearer the question"),
        (" 48597", 48503, "key copied wrong"),  # the first three digits of a key of the prompt
        (" 2492.", 46044, "key copied wrong"),  # 24933's
        (" 12345", 46044, "other number"),
        (" 48897", 48503, "other number"),  # two digits of a key are not a copy of it
        (" 93760", 46044, "other number"),  # a key of another prompt is not one of this prompt's
        (" blue. The pass key of", 46044, "no number"),
    ],
)
def test_a_three_key_miss_is_sorted_by_where_its_number_comes_from(answer, asked, kind):
    """experiments/multikey_misses.py: a miss's first number against the keys of its own prompt, in planted order."""
    misses = load_script("multikey_misses")
    prompt = misses.prompts_of(12)
    assert prompt[46044] == [46044, 68239, 24933] and prompt[65683] == [65683, 34101, 46866]
    assert misses.kind(answer, asked, prompt[asked]) == kind


def test_three_key_misses_are_counted_by_the_key_asked(tmp_path, monkeypatch, capsys):
    """experiments/multikey_misses.py's last line: each miss counted by where the key asked was planted in its
    prompt."""
    misses = load_script("multikey_misses")
    record = {"length": 32768, "multikey_probes": 12, "multikey_misses": []}
    record["multikey_misses"] = [[0.04, 46044, " 68239"], [0.3, 34101, " 46866"], [0.9, 46866, " 65683"]]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"baseline:4:float32": 1.0, "m:4 float32": [record]}))
    monkeypatch.setattr("sys.argv", ["multikey_misses.py", "--results", str(results)])
    misses.main()
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[-2]
        == "all: key nearer the question 2, key farther back 1, key copied wrong 0, other number 0, no number 0"
    )
    assert lines[-1] == "by the key asked: first planted 1, second planted 1, third planted 1"
