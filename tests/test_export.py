"""Portable export: stock transformers, in a process that never imports hf_rope_ext, gives the patched logits."""

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, MistralConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import hf_rope_ext
from hf_rope_ext.cli import main
from hf_rope_ext.publish.export import NotLowerable, lower_config
from hf_rope_ext.types.registry import REQUIRED, methods

MAX_POS = 64  # L0 of the tiny models; logits are compared at 100 positions, past it
FAMILIES = {"llama": LlamaConfig, "mistral": MistralConfig}
LOWERABLE = [m for m in methods() if m.kind == "frequency" and not m.dynamic]
NOT_LOWERABLE = [m for m in methods() if m.kind != "frequency" or m.dynamic]
STOCK = {
    "linear": {"factor": 2.0},
    "yarn": {"factor": 2.0, "original_max_position_embeddings": 32},
    "llama3": {"factor": 4.0, "original_max_position_embeddings": 32, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
EXPECTED_FORM = {"ntk": "default", "ntk_by_parts": "yarn"}  # other static package types -> longrope

# Run in a fresh interpreter: hf_rope_ext cannot be imported there; each export's card snippet is run as written.
LOAD_SCRIPT = r"""
import json, re, sys
sys.modules["hf_rope_ext"] = None  # any `import hf_rope_ext` now fails
import torch
from huggingface_hub import ModelCard
ids = torch.arange(100).remainder(64)[None]
report = {}
for folder, expected in json.loads(sys.argv[1]):
    snippet = re.findall(r"```python\n(.*?)```", ModelCard.load(folder + "/README.md").text, flags=re.S)[0]
    scope = {}
    exec(snippet, scope)
    with torch.no_grad():
        report[folder] = (scope["model"].eval()(ids).logits - torch.load(expected)).abs().max().item()
assert not [m for m in sys.modules if m.startswith("hf_rope_ext") and sys.modules[m] is not None]
del sys.modules["hf_rope_ext"]  # the package imported after a vendored copy: each registers its own torch op
from hf_rope_ext.attention.engine import traced_scores
copies = [m for name, m in sys.modules.items() if name.startswith("_hf_rope_ext") and name.endswith(".traced_scores")]
ops = {module.OP.split("::")[1] for module in [traced_scores, *copies]}
assert len(ops) == len(copies) + 1 and all(hasattr(torch.ops.hf_rope_ext, op) for op in ops), ops
print(json.dumps({"errors": report, "copies": len(copies)}))
"""


def tiny_config(family: str, rope_parameters: dict, **extra):
    return FAMILIES[family](
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        max_position_embeddings=MAX_POS,
        rope_parameters={"rope_theta": 10000.0, **rope_parameters},
        **extra,
    )


def params_for(method) -> dict:
    """The method's parameters: factor 4 where it takes one, its example (else 2) for any other required key."""
    params = {"rope_type": method.name}
    for key, spec in method.params.items():
        if key == "factor" or spec.default is REQUIRED:
            params[key] = 4.0 if key == "factor" else method.example.get(key, 2 if spec.kind == "int" else 2.0)
    return params


def save_patched(folder: Path, family: str, rope_parameters: dict) -> Path:
    """Save a tiny random model and the logits the patched model gives (hf_rope_ext imported here)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, rope_parameters)).eval()
    model.save_pretrained(folder)
    with torch.no_grad():
        torch.save(model(torch.arange(100).remainder(64)[None]).logits, folder.parent / f"{folder.name}.expected.pt")
    return folder


def load_without_package(pairs: list[tuple[Path, Path]], tmp_path: Path, copies: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    argv = json.dumps([[str(a), str(b)] for a, b in pairs])
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, argv], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-4000:]
    done = json.loads(out.stdout.strip().splitlines()[-1])
    assert done["copies"] == copies  # vendored copies of the package the remote code imported (the package after)
    return done["errors"]


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes() if path.is_file() else b"dir")
    return digest.hexdigest()


CASES = [(f, m.name, params_for(m)) for f in FAMILIES for m in LOWERABLE] + [
    ("llama", name, {"rope_type": name, **p}) for name, p in STOCK.items()
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every lowerable case exported; one fresh interpreter loads them all through their cards' snippets."""
    tmp = tmp_path_factory.mktemp("export")
    pairs, results = [], {}
    for family, name, params in CASES:
        src = save_patched(tmp / f"{family}-{name}", family, params)
        digest = tree_digest(src)
        results[(family, name)] = hf_rope_ext.export(src, tmp / f"{family}-{name}-stock")
        assert tree_digest(src) == digest  # src is only read
        pairs.append((tmp / f"{family}-{name}-stock", tmp / f"{family}-{name}.expected.pt"))
    errors = load_without_package(pairs, tmp)
    return {key: (result, errors[str(result.directory)]) for key, result in results.items()}


@pytest.mark.parametrize("family,name", [c[:2] for c in CASES], ids=[f"{f}-{n}" for f, n, _ in CASES])
def test_export_loads_in_stock_transformers_with_the_same_logits(exported, family, name):
    result, max_error = exported[(family, name)]
    assert max_error <= 1e-5
    written = json.loads((result.directory / "config.json").read_text())
    expected = name if name in STOCK else EXPECTED_FORM.get(name, "longrope")
    assert written["rope_parameters"]["rope_type"] == expected
    assert result.mode == ("stock" if name in STOCK else "lowered")
    card = ModelCard.load(result.directory / "README.md")
    assert card.data.library_name == "transformers" and "hf-rope-ext" in card.data.tags


@pytest.mark.parametrize("method", LOWERABLE, ids=lambda m: m.name)
def test_legacy_keys_alone_give_the_same_frequencies(method):
    """Older readers see rope_scaling + top-level rope_theta: transformers builds the same rotary from them alone."""
    config = tiny_config("llama", params_for(method)).to_dict()
    lowered = lower_config(config)
    assert lowered["rope_theta"] == lowered["rope_parameters"]["rope_theta"]
    legacy = {k: v for k, v in lowered.items() if k not in ("rope_parameters", "model_type", "transformers_version")}
    modern = {k: v for k, v in lowered.items() if k not in ("rope_scaling", "model_type", "transformers_version")}
    a, b = LlamaRotaryEmbedding(LlamaConfig(**legacy)), LlamaRotaryEmbedding(LlamaConfig(**modern))
    assert torch.equal(a.inv_freq, b.inv_freq) and a.attention_scaling == b.attention_scaling
    assert (lowered["rope_scaling"] is None) == (lowered["rope_parameters"]["rope_type"] == "default")


def test_lowered_forms_follow_their_formulas():
    """ntk's base b*s^(d/(d-2)), ntk_by_parts' attention factor 1, part_ntk's equal longrope factor lists."""
    ntk = lower_config(tiny_config("llama", {"rope_type": "ntk", "factor": 4.0}).to_dict())["rope_parameters"]
    dim = 32
    assert math.isclose(ntk["rope_theta"], 10000.0 * 4.0 ** (dim / (dim - 2)), rel_tol=1e-12)
    yarn = lower_config(tiny_config("llama", {"rope_type": "ntk_by_parts", "factor": 4.0}).to_dict())["rope_parameters"]
    assert yarn["attention_factor"] == 1.0 and yarn["original_max_position_embeddings"] == MAX_POS
    part = lower_config(tiny_config("llama", {"rope_type": "part_ntk", "factor": 4.0}).to_dict())["rope_parameters"]
    assert part["short_factor"] == part["long_factor"] and len(part["short_factor"]) == dim // 2
    theta = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq = hf_rope_ext.get_method("part_ntk").frequencies(
        tiny_config("llama", {"rope_type": "part_ntk", "factor": 4.0})
    )[0]
    torch.testing.assert_close(
        torch.tensor(part["short_factor"], dtype=torch.float64), theta / inv_freq.double(), rtol=1e-6, atol=0
    )


@pytest.mark.parametrize("method", NOT_LOWERABLE, ids=lambda m: m.name)
def test_types_without_a_stock_form_are_refused_without_remote_code(method, tmp_path):
    src = save_patched(tmp_path / "src", "llama", params_for(method))
    with pytest.raises(NotLowerable, match=f"rope_type='{method.name}'.*--remote-code"):
        hf_rope_ext.export(src, tmp_path / "dst")
    assert (
        not (tmp_path / "dst").exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    )


def test_remote_code_loads_without_the_package(tmp_path):
    """dynamic_yarn (frequencies change with the length) and an attention-level type, through trust_remote_code."""
    names = ["dynamic_yarn", "rerope"]
    pairs = []
    for name in names:
        params = (
            {"rope_type": name, "original_max_position_embeddings": 32}
            if name == "dynamic_yarn"
            else params_for(hf_rope_ext.get_method(name))
        )
        src = save_patched(tmp_path / name, "llama", params)
        result = hf_rope_ext.export(src, tmp_path / f"{name}-remote", remote_code=True)
        assert result.mode == "remote-code"
        config = json.loads((result.directory / "config.json").read_text())
        assert config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_hf_rope_ext.")
        assert "trust_remote_code=True" in (result.directory / "README.md").read_text()
        pairs.append((result.directory, tmp_path / f"{name}.expected.pt"))
    pairs.append(interleaved_export(tmp_path))
    errors = load_without_package(pairs, tmp_path, copies=1)
    assert max(errors.values()) <= 1e-5, errors


def interleaved_export(tmp_path: Path) -> tuple[Path, Path]:
    """A lowerable type saved in the interleaved layout still goes through the remote code (which converts on load)."""
    src = save_patched(tmp_path / "interleaved", "llama", {"rope_type": "ntk", "factor": 2.0})
    model = AutoModelForCausalLM.from_pretrained(src)
    hf_rope_ext.convert_layout(model, to="interleaved").save_pretrained(src)  # same logits, interleaved weights
    result = hf_rope_ext.export(src, tmp_path / "interleaved-remote", remote_code=True)
    assert result.mode == "remote-code"
    return result.directory, tmp_path / "interleaved.expected.pt"


def test_bad_input_and_overwrite(tmp_path):
    src = save_patched(tmp_path / "src", "llama", {"rope_type": "ntk", "factor": 2.0})
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf_rope_ext.export(tmp_path / "empty", tmp_path / "out")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="peft adapter"):
        hf_rope_ext.export(tmp_path / "adapter", tmp_path / "out")
    with pytest.raises(ValueError, match="outside src"):
        hf_rope_ext.export(src, src / "inside")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="--overwrite"):
        hf_rope_ext.export(src, tmp_path / "taken")
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep"
    hf_rope_ext.export(src, tmp_path / "taken", overwrite=True)
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep"  # --overwrite replaces only what export writes
    assert (tmp_path / "taken" / "model.safetensors").is_file()
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "bogus").mkdir()
    bogus = {**config, "rope_parameters": {"rope_type": "bogus", "rope_theta": 10000.0}}
    (tmp_path / "bogus" / "config.json").write_text(json.dumps(bogus))
    with pytest.raises(KeyError, match="bogus"):
        hf_rope_ext.export(tmp_path / "bogus", tmp_path / "bogus-out")
    (tmp_path / "interleaved").mkdir()
    (tmp_path / "interleaved" / "config.json").write_text(json.dumps({**config, "rope_layout": "interleaved"}))
    with pytest.raises(NotLowerable, match="rope_layout='interleaved'.*--remote-code"):
        hf_rope_ext.export(tmp_path / "interleaved", tmp_path / "interleaved-out")


def test_cli(tmp_path, capsys):
    src = save_patched(tmp_path / "src", "llama", {"rope_type": "ntk_by_parts", "factor": 2.0})
    assert main(["export", str(src), str(tmp_path / "out"), "--license", "mit"]) == 0
    assert "lowered: rope_type ntk_by_parts -> yarn" in capsys.readouterr().out
    assert ModelCard.load(tmp_path / "out" / "README.md").data.license == "mit"
    assert AutoConfig.from_pretrained(tmp_path / "out").rope_parameters["rope_type"] == "yarn"
    dynamic = save_patched(
        tmp_path / "dynamic", "llama", {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 64}
    )
    assert main(["export", str(dynamic), str(tmp_path / "dynamic-out")]) == 2
    assert "no stock transformers type is equivalent" in capsys.readouterr().err


def test_a_checkpoint_in_its_familys_own_layout_is_what_stock_transformers_runs():
    """The family says which layout stock transformers runs: half for Llama, interleaved for RoFormer."""
    from hf_rope_ext.publish.export import check_layout

    check_layout({"model_type": "llama"})
    check_layout({"model_type": "roformer"})  # its native interleaved layout, recorded or not
    check_layout({"model_type": "roformer", "rope_layout": "interleaved"})
    with pytest.raises(NotLowerable, match="rope_layout='half'.*only runs 'interleaved'"):
        check_layout({"model_type": "roformer", "rope_layout": "half"})
    with pytest.raises(NotLowerable, match="rope_layout='interleaved'.*only runs 'half'"):
        check_layout({"model_type": "llama", "rope_layout": "interleaved"})
