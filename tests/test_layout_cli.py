"""``hf-rope-ext convert-layout SRC DST --to ...`` over saved model directories (sharded) and adapter directories."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from conftest import tiny_model
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_rope_ext.cli import main


def read_dir(path):
    """All tensors of a directory's safetensors files, merged."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out |= load_file(f)
    return out


def digest(path):
    return {
        p.relative_to(path): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()
    }


def ref_to_interleaved(t, heads):
    """Half -> interleaved rows per head (whole head rotary): (j, j + d/2) -> (2j, 2j + 1)."""
    return t.reshape(heads, 2, -1, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def logits(model):
    with torch.no_grad():
        return model(torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])).logits


@pytest.fixture()
def saved(tmp_path):
    model = tiny_model("llama", attention_bias=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    model.save_pretrained(tmp_path / "src", max_shard_size="40KB")
    (tmp_path / "src" / "notes.txt").write_text("kept as is\n")
    return model, tmp_path


def test_sharded_model_round_trip_and_source_untouched(saved, capsys):
    model, tmp = saved
    src = tmp / "src"
    assert len(list(src.glob("*.safetensors"))) > 1
    before = digest(src)
    assert main(["convert-layout", str(src), str(tmp / "inter"), "--to", "interleaved"]) == 0
    out = capsys.readouterr().out
    assert "rope_layout half -> interleaved" in out and "model.layers.*.self_attn.q_proj.weight  x2" in out
    assert "model.layers.*.self_attn.k_proj.bias  x2" in out
    assert digest(src) == before
    half, inter = read_dir(src), read_dir(tmp / "inter")
    assert half.keys() == inter.keys()
    for key, value in half.items():
        heads = 4 if ".q_proj." in key else 2
        expect = ref_to_interleaved(value, heads) if ".q_proj." in key or ".k_proj." in key else value
        assert torch.equal(inter[key], expect), key
    assert json.loads((tmp / "inter" / "config.json").read_text())["rope_layout"] == "interleaved"
    assert (tmp / "inter" / "model.safetensors.index.json").read_text() == (
        src / "model.safetensors.index.json"
    ).read_text()
    assert (tmp / "inter" / "notes.txt").read_text() == "kept as is\n"
    loaded = AutoModelForCausalLM.from_pretrained(tmp / "inter", attn_implementation="eager").eval()
    torch.testing.assert_close(logits(loaded), logits(model.eval()), rtol=0, atol=0)
    # back to half: bit-identical tensors
    assert main(["convert-layout", str(tmp / "inter"), str(tmp / "back"), "--to", "half"]) == 0
    back = read_dir(tmp / "back")
    assert all(torch.equal(back[k], v) for k, v in half.items())


def test_refusals(saved, capsys):
    _, tmp = saved
    src = tmp / "src"
    (tmp / "dst").mkdir()
    (tmp / "dst" / "mine.txt").write_text("user data")
    assert main(["convert-layout", str(src), str(tmp / "dst"), "--to", "interleaved"]) == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert (tmp / "dst" / "mine.txt").read_text() == "user data"
    assert main(["convert-layout", str(src), str(src), "--to", "interleaved", "--overwrite"]) == 2
    assert main(["convert-layout", str(src), str(src / "sub"), "--to", "interleaved"]) == 2
    assert "overlaps SRC" in capsys.readouterr().err
    assert main(["convert-layout", str(src), str(tmp / "x"), "--to", "half"]) == 2
    assert "already in rope_layout='half'" in capsys.readouterr().err
    assert main(["convert-layout", str(tmp / "nowhere"), str(tmp / "y"), "--to", "half"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["convert-layout", str(src), str(tmp / "z"), "--to", "diagonal"]) == 2
    assert not (tmp / "x").exists() and not (tmp / "y").exists()
    assert main(["convert-layout", str(src), str(tmp / "dst"), "--to", "interleaved", "--overwrite"]) == 0
    assert (tmp / "dst" / "mine.txt").read_text() == "user data"  # --overwrite replaces only what it writes
    assert "kept 1 file(s) this command does not write: mine.txt" in capsys.readouterr().out


def test_adapter_directory(saved, capsys):
    from peft import LoraConfig, get_peft_model

    model, tmp = saved
    torch.manual_seed(0)
    peft_model = get_peft_model(
        model, LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp / "adapter")
    config = json.loads((tmp / "adapter" / "adapter_config.json").read_text())
    assert main(["convert-layout", str(tmp / "adapter"), str(tmp / "a_int"), "--to", "interleaved"]) == 2
    assert "--config" in capsys.readouterr().err  # base_model_name_or_path is not a local directory
    args = [
        "convert-layout",
        str(tmp / "adapter"),
        str(tmp / "a_int"),
        "--to",
        "interleaved",
        "--config",
        str(tmp / "src"),
    ]
    assert main(args) == 0
    assert "adapter" in capsys.readouterr().out
    before, after = (
        load_file(tmp / "adapter" / "adapter_model.safetensors"),
        load_file(tmp / "a_int" / "adapter_model.safetensors"),
    )
    for key, value in before.items():
        moved = "lora_B" in key and (".q_proj." in key or ".k_proj." in key)
        expect = ref_to_interleaved(value, 4 if ".q_proj." in key else 2) if moved else value
        assert torch.equal(after[key], expect), key
    with safe_open(tmp / "a_int" / "adapter_model.safetensors", "pt") as handle:
        assert handle.metadata()["rope_layout"] == "interleaved"
    assert json.loads((tmp / "a_int" / "adapter_config.json").read_text()) == config
    # a second conversion to the same layout is refused (the layout is read back from the metadata)
    args = ["convert-layout", str(tmp / "a_int"), str(tmp / "a2"), "--to", "interleaved", "--config", str(tmp / "src")]
    assert main(args) == 2
    assert "already in rope_layout='interleaved'" in capsys.readouterr().err
    args = [
        "convert-layout",
        str(tmp / "a_int"),
        str(tmp / "a_back"),
        "--to",
        "half",
        "--config",
        str(tmp / "src" / "config.json"),
    ]
    assert main(args) == 0
    back = load_file(tmp / "a_back" / "adapter_model.safetensors")
    assert all(torch.equal(back[k], v) for k, v in before.items())


def test_run_folder_converts_its_top_level_files_and_names_the_subfolders_left_out(saved, capsys):
    from peft import LoraConfig, get_peft_model

    from hf_rope_ext.publish.cards import write_model_card

    model, tmp = saved
    run = tmp / "run"
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "k_proj"])).save_pretrained(run)
    (run / "README.md").unlink()
    write_model_card(run, kind="adapter", rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    (run / "checkpoints" / "step-000001" / "optimizer.bin").write_bytes(b"state")
    model.save_pretrained(run / "merged")
    dst = tmp / "run-interleaved"
    assert main(["convert-layout", str(run), str(dst), "--to", "interleaved", "--config", str(tmp / "src")]) == 0
    out = capsys.readouterr().out
    assert "left out, not converted: checkpoints/, merged/" in out
    assert sorted(p.name for p in dst.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in run.iterdir() if p.is_file()
    )
    assert "Rotary layout: `interleaved` (pairs (2i, 2i+1)" in (dst / "README.md").read_text()
    assert "Rotary layout: `half`" in (run / "README.md").read_text()
