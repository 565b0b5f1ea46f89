"""Model cards: they parse with huggingface_hub's ModelCard and their usage snippets load the folder as written."""

import os
import re
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import hf_rope_ext  # noqa: F401  (registers the rope types)
from hf_rope_ext.publish.cards import write_model_card
from hf_rope_ext.types.registry import REQUIRED, methods

ROOT = Path(__file__).resolve().parents[1]
NTK = {"rope_type": "ntk", "factor": 4.0, "rope_theta": 10000.0}


def tiny_config(rope_parameters=None) -> LlamaConfig:
    return conftest.tiny_config("llama", rope_parameters, **conftest.SMALL)


def params_for(method) -> dict:
    """Valid rope_parameters of a registry method: its defaults, 2 for required keys."""
    required = {
        k: method.example.get(k, 2 if spec.kind == "int" else 2.0)
        for k, spec in method.params.items()
        if spec.default is REQUIRED
    }
    return {"rope_type": method.name, "rope_theta": 10000.0, **required}


def snippet_of(readme: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", ModelCard.load(readme).text, flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def run_snippet(snippet: str, check: str) -> str:
    """Run the snippet as written in a fresh interpreter, then ``check``; returns stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", snippet + "\n" + check], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def logits_check(expected_path: Path) -> str:
    """Code that compares ``model``'s logits (fp32, 1e-5) with the tensor saved at ``expected_path``."""
    return (
        f"import torch\nexpected = torch.load({str(expected_path)!r})\n"
        "ids = torch.arange(40).remainder(64)[None]\n"
        "torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=1e-5)\n"
    )


def logits(model) -> torch.Tensor:
    ids = torch.arange(40).remainder(64)[None]
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def extended(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(NTK)).eval()
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model", model


def test_extended_card_parses_and_snippet_loads_in_fresh_process(extended, tmp_path):
    folder, model = extended
    results = [{"rope_type": "ntk", "factor": 4.0, "length": 256, "perplexity": 9.5, "passkey_accuracy": 1.0}]
    readme = write_model_card(
        folder, kind="extended", base_model="org/base-model", results=results, training={"lr": 1e-4}, license="mit"
    )
    card = ModelCard.load(readme)
    assert card.data.library_name == "transformers" and card.data.license == "mit"
    assert card.data.base_model == "org/base-model"
    assert {"hf-rope-ext", "rope", "long-context"} <= set(card.data.tags)
    assert "| ntk | 4 | 256 | 9.5 | 1 |" in card.text and "`lr`" in card.text
    torch.save(logits(model), tmp_path / "expected.pt")
    check = logits_check(tmp_path / "expected.pt") + "print(model.config.rope_parameters['rope_type'])"
    assert run_snippet(snippet_of(readme), check).strip() == "ntk"


@pytest.mark.parametrize("with_config", [False, True], ids=["bare-adapter", "adapter-with-extended-config"])
def test_adapter_card_snippet_loads_base_with_its_rope_parameters(tmp_path, with_config):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config()).save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", rope_parameters=NTK)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")  # peft writes its placeholder README.md: ours may replace it
    if with_config:  # as `hf-rope-ext finetune` writes it: the extended base config beside the adapter
        base.config.save_pretrained(tmp_path / "adapter")
    readme = write_model_card(
        tmp_path / "adapter", kind="adapter", base_model=str(tmp_path / "base"), rope_parameters=NTK
    )
    card = ModelCard.load(readme)
    assert card.data.library_name == "peft" and card.data.base_model is None  # a local path is no Hub id
    torch.save(logits(peft_model.eval()), tmp_path / "expected.pt")
    check = logits_check(tmp_path / "expected.pt")
    check += "print(type(model).__name__, model.get_base_model().config.rope_parameters['rope_type'])"
    assert run_snippet(snippet_of(readme), check).split() == ["PeftModelForCausalLM", "ntk"]


@pytest.mark.parametrize("method", methods(), ids=lambda m: m.name)
def test_card_of_every_rope_type_parses_and_its_snippet_runs(method, tmp_path):
    model = LlamaForCausalLM(tiny_config(params_for(method))).eval()
    model.save_pretrained(tmp_path)
    readme = write_model_card(tmp_path, kind="extended")
    card = ModelCard.load(readme)
    assert f"rope-{method.name}".replace("_", "-") in card.data.tags
    assert f"| `rope_type` | {method.name} |" in card.text
    scope = {}
    exec(snippet_of(readme), scope)  # in-process: the fresh-process run is the test above
    torch.testing.assert_close(logits(scope["model"].eval()), logits(model), rtol=0, atol=1e-5)


def test_user_readme_is_never_overwritten(extended):  # the message names no flag that does not exist
    folder, _ = extended
    (folder / "README.md").write_text("# my own notes\n")
    with pytest.raises(FileExistsError, match=r"was not written by hf-rope-ext; refusing to replace it \(move it away"):
        write_model_card(folder, kind="extended")
    assert (folder / "README.md").read_text() == "# my own notes\n"
    write_model_card(folder, kind="extended", overwrite=True)
    write_model_card(folder, kind="extended", notes="second run")  # our own card may be regenerated
    assert "second run" in (folder / "README.md").read_text()


def test_plot_is_linked_and_must_lie_inside_the_folder(extended, tmp_path):
    folder, _ = extended
    (folder / "ppl.png").write_bytes(b"\x89PNG\r\n")
    readme = write_model_card(folder, kind="extended", plot=folder / "ppl.png")
    assert "![evaluation](ppl.png)" in readme.read_text()
    (tmp_path / "outside.png").write_bytes(b"\x89PNG\r\n")
    with pytest.raises(ValueError, match="plot="):
        write_model_card(folder, kind="extended", plot=tmp_path / "outside.png")


def test_bad_input(extended, tmp_path):
    folder, _ = extended
    with pytest.raises(ValueError, match="kind='merged'"):
        write_model_card(folder, kind="merged")
    with pytest.raises(ValueError, match="rope_layout='sideways'"):
        write_model_card(folder, kind="extended", rope_layout="sideways")
    with pytest.raises(KeyError, match="perplexity"):
        write_model_card(folder, kind="extended", results=[{"rope_type": "ntk", "factor": 2, "length": 8}])
    with pytest.raises(NotADirectoryError):
        write_model_card(tmp_path / "missing", kind="extended")
    assert not (folder / "README.md").exists()


SHIPPED_EXAMPLES = sorted(p.parent for p in (ROOT / "examples").glob("*/adapter_config.json"))


@pytest.mark.parametrize("folder", SHIPPED_EXAMPLES, ids=lambda p: p.name)
def test_a_shipped_adapter_names_no_path_of_the_machine_that_trained_it(folder):
    """examples/*: the adapter's base is the Hub name of SmolLM2 (``smollm2.BASE``), and no card or config names a
    folder of the training machine (a user's clone has none of them); the card parses and says how it was measured."""
    import json

    from hf_rope_ext.store import smollm2

    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == smollm2.BASE
    for name in ("README.md", "adapter_config.json", "config.json"):
        text = (folder / name).read_text(encoding="utf-8")
        assert not re.search(r"(/root/|/work/|/tmp/|/home/|[A-Z]:\\\\)", text), (name, folder.name)
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model == smollm2.BASE and card.data.license == "apache-2.0"
    assert "\n## Measured\n" in card.text and "experiments/real_model_report.py" in card.text
