"""An adapter trained with extended rope parameters, as stock loaders read it.

peft's ``AutoPeftModelForCausalLM`` builds the base from ``base_model_name_or_path`` with the base's own config, so
the extended ``config.json`` that ``finetune`` saves beside an adapter is not read (pinned below: if peft ever reads
it, the shipped card's warning must change). ``bundle_adapter`` (``hf-rope-ext get-smollm2 --adapter``) writes the
adapter with an extended base folder that it names; then peft, transformers, ``load_adapter`` and ``eval --adapter``
all give the logits of the adapter on the extended base."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_byte_llama
from peft import AutoPeftModelForCausalLM, LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from hf_rope_ext.cli import main
from hf_rope_ext.eval import adapters
from hf_rope_ext.eval.loading import load_model
from hf_rope_ext.store import smollm2
from hf_rope_ext.train import bundle_adapter, load_adapter
from hf_rope_ext.train.model import extended_config

L0 = 32
IDS = torch.arange(3, 3 + 4 * L0)[None]  # past L0: where the extended rope parameters matter


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(base folder, adapter folder): a LoRA adapter (non-zero) on the base read with yarn x4, its extended config
    beside it as ``finetune`` leaves it, its base_model_name_or_path the base folder."""
    root = tmp_path_factory.mktemp("trained")
    base = save_byte_llama(root / "base", L0)
    config = extended_config(str(base), "yarn", 4 * L0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, config=config)
    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(root / "adapter")
    config.save_pretrained(root / "adapter")
    adapter_config = json.loads((root / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base)
    return base, root / "adapter"


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits[0]


def test_every_loader_reads_the_bundle_as_the_adapter_was_trained(trained, tmp_path):
    base, adapter = trained
    expected = load_adapter(str(adapter), base=str(base))
    out = bundle_adapter(adapter, base, tmp_path / "bundle")
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(out / "base")
    assert not (out / "config.json").exists()  # else transformers would take the folder for a whole model
    split = adapters.split(None, str(out))
    loaders = {
        "peft AutoPeftModelForCausalLM": lambda: AutoPeftModelForCausalLM.from_pretrained(str(out)),
        "transformers AutoModelForCausalLM": lambda: AutoModelForCausalLM.from_pretrained(out),
        "load_adapter": lambda: load_adapter(out),
        "eval --adapter": lambda: load_model(split[0], adapter=split[1]),
    }
    for name, load in loaders.items():
        model = load()
        assert model.config.rope_parameters == expected.config.rope_parameters, name
        assert model.config.max_position_embeddings == 4 * L0, name
        assert torch.equal(logits(model), logits(expected)), name


def test_peft_alone_builds_the_base_with_the_bases_own_config(trained):
    """What the card warns of: the adapter folder's extended config.json is not read by AutoPeftModelForCausalLM."""
    base, adapter = trained
    model = AutoPeftModelForCausalLM.from_pretrained(str(adapter))
    assert model.config.rope_parameters["rope_type"] == "default" and model.config.max_position_embeddings == L0
    assert not torch.allclose(logits(model), logits(load_adapter(str(adapter), base=str(base))), atol=1e-3)


def test_a_base_of_another_shape_is_refused_and_nothing_is_written(trained, tmp_path):
    _, adapter = trained
    other = save_byte_llama(tmp_path / "other", L0)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"num_hidden_layers: 2 in .* but 3 in .*pass its own base"):
        bundle_adapter(adapter, other, tmp_path / "bundle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_get_smollm2_adapter_checks_its_arguments_before_fetching(trained, tmp_path, capsys, monkeypatch):
    _, adapter = trained
    monkeypatch.setattr(smollm2, "ensure", lambda folder=None: pytest.fail("fetched before the arguments were checked"))
    cases = {
        "required with --adapter": ["--adapter", str(adapter)],
        "is not a peft adapter folder": ["--adapter", str(tmp_path), "--out", str(tmp_path / "x")],
        "exists and is not empty": ["--adapter", str(adapter), "--out", str(adapter.parent)],
    }
    for message, argv in cases.items():
        assert main(["get-smollm2", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
