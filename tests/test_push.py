"""``hf-rope-ext push``: the dry-run folder is exactly what would go up and loads; failures change nothing local."""

import hashlib
import json
import socket

import conftest
import huggingface_hub.constants
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import hf_rope_ext  # noqa: F401  (registers the rope types)
from hf_rope_ext.cli import main
from hf_rope_ext.publish.cards import write_model_card
from hf_rope_ext.publish.hub import HubError, push

NTK = {"rope_type": "ntk", "factor": 4.0, "rope_theta": 10000.0}
IDS = torch.arange(90).remainder(64)[None]


def tiny_model(rope_parameters=None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = conftest.tiny_config("llama", rope_parameters, **conftest.SMALL)
    return LlamaForCausalLM(config).eval()


def digest(folder) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode() + (path.read_bytes() if path.is_file() else b"/"))
    return h.hexdigest()


@pytest.fixture
def saved(tmp_path):
    model = tiny_model(NTK)
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model", model


def test_dry_run_folder_is_the_upload_and_loads(saved, tmp_path):
    src, model = saved
    write_model_card(src, kind="extended", results=[{"rope_type": "ntk", "factor": 4, "length": 90, "perplexity": 3.0}])
    before = digest(src)
    out = push(src, "someone/tiny-ntk", dry_run=tmp_path / "dry")
    assert digest(src) == before
    uploaded = [p.name for p in (tmp_path / "dry").iterdir() if not p.name.startswith(".")]  # .hf-rope-ext-files.json
    assert sorted(uploaded) == sorted(p.name for p in src.iterdir())
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "dry" / name).read_bytes() == (src / name).read_bytes()
    card = ModelCard.load(tmp_path / "dry" / "README.md")
    assert 'from_pretrained("someone/tiny-ntk")' in card.text and "| ntk | 4 | 90 | 3 |" in card.text
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits, rtol=0, atol=1e-5)


def test_a_folder_without_card_gets_one_and_a_user_card_goes_up_unchanged(saved, tmp_path):
    src, _ = saved
    push(src, "tiny", dry_run=tmp_path / "a")
    card = ModelCard.load(tmp_path / "a" / "README.md")
    assert card.data.library_name == "transformers" and 'from_pretrained("tiny")' in card.text
    assert not (src / "README.md").exists()
    (src / "README.md").write_text("# mine\n")
    push(src, "tiny", dry_run=tmp_path / "b")
    assert (tmp_path / "b" / "README.md").read_text() == "# mine\n"


def test_adapter_dry_run_loads_with_peft(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    tiny_model().save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", rope_parameters=NTK)
    adapter = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "adapter")  # leaves peft's placeholder README.md, which we may replace
    push(tmp_path / "adapter", "someone/tiny-lora", dry_run=tmp_path / "dry", base_model_id="someone/tiny-base")
    card = ModelCard.load(tmp_path / "dry" / "README.md")
    assert (
        card.data.library_name == "peft" and 'AutoPeftModelForCausalLM.from_pretrained("someone/tiny-lora"' in card.text
    )
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "base", rope_parameters=NTK)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "dry").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, adapter.eval()(IDS).logits, rtol=0, atol=1e-5)


def test_bad_input(saved, tmp_path, capsys):
    src, _ = saved
    (tmp_path / "empty").mkdir()
    assert main(["push", str(tmp_path / "empty"), "--repo-id", "a/b", "--dry-run", str(tmp_path / "x")]) == 2
    assert "neither a saved model" in capsys.readouterr().err
    assert main(["push", str(src), "--repo-id", "bad repo!!", "--dry-run", str(tmp_path / "x")]) == 2
    assert "--repo-id 'bad repo!!' is not a valid Hub repo id" in capsys.readouterr().err
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(
        json.dumps({**config, "rope_parameters": {"rope_type": "bogus", "rope_theta": 1e4}})
    )
    assert main(["push", str(src), "--repo-id", "a/b", "--dry-run", str(tmp_path / "x")]) == 2
    assert "rope_type='bogus'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_missing_token_and_unreachable_hub_change_nothing(saved, tmp_path, monkeypatch, capsys):
    src, _ = saved
    before = sorted(p.name for p in tmp_path.rglob("*")), digest(src)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    with pytest.raises(ValueError, match="no Hugging Face token"):
        push(src, "someone/tiny")
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubError, match=f"127.0.0.1:{port}"):
        push(src, "someone/tiny", token="hf_not_a_real_token")
    assert main(["push", str(src), "--repo-id", "someone/tiny", "--token", "hf_fake"]) == 1
    assert "pushing to 'someone/tiny'" in capsys.readouterr().err
    assert (sorted(p.name for p in tmp_path.rglob("*")), digest(src)) == before


@pytest.fixture
def run_folder(tmp_path):
    """What `hf-rope-ext finetune --merge --save-every N` leaves: adapter, extended config, card naming the base by
    its local path, checkpoints/ with optimizer and RNG state, merged/, logs/."""
    from peft import LoraConfig, get_peft_model

    tiny_model().save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", rope_parameters=NTK)
    run = tmp_path / "run"
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(run)
    base.config.save_pretrained(run)
    (run / "README.md").unlink()
    write_model_card(run, kind="adapter", base_model=str(tmp_path / "base"))
    for name in ("checkpoints/step-000002/optimizer.bin", "checkpoints/step-000002/random_states_0.pkl"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(b"state")
    base.save_pretrained(run / "merged")
    (run / "logs").mkdir()
    (run / "logs" / "train_log.csv").write_text("step,loss\n")
    (run / "optimizer.pt").write_bytes(b"state")
    return run


def test_push_of_a_run_folder_uploads_what_a_reader_needs_with_the_base_as_a_hub_id(run_folder, tmp_path, capsys):
    import os
    import subprocess
    import sys
    from pathlib import Path

    base = str(tmp_path / "base")
    assert main(["push", str(run_folder), "--repo-id", "me/run", "--dry-run", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert f"names its base model by the local path {base!r}" in err and "--base-model-id" in err
    assert not (tmp_path / "refused").exists()
    dry = tmp_path / "dry"
    argv = ["push", str(run_folder), "--repo-id", "me/run", "--base-model-id", "me/base", "--dry-run", str(dry)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "hf_rope_ext", *argv], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    uploaded = ["README.md", "adapter_config.json", "adapter_model.safetensors", "config.json"]
    shown = [p for p in dry.iterdir() if not p.name.startswith(".")]  # hidden: the dry run's own record, never pushed
    assert sorted(p.name for p in shown) == uploaded and all(p.is_file() for p in shown)
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ")]
    assert listed == uploaded  # the file list is shown before anything is written
    for left in ("checkpoints/ (training state)", "merged/ (the merged model", "logs/", "optimizer.pt"):
        assert f"left out: {left}" in out.stdout
    assert json.loads((dry / "adapter_config.json").read_text())["base_model_name_or_path"] == "me/base"
    card = ModelCard.load(dry / "README.md")
    assert card.data.base_model == "me/base" and "Base model: `me/base`." in card.text
    assert 'adapter = "me/run"' in card.text
    assert all(base not in p.read_text(errors="replace") for p in dry.iterdir() if p.suffix in (".md", ".json"))
    assert (run_folder / "README.md").read_text().count(base) == 1  # the source folder is only read
