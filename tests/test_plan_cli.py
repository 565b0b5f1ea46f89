"""``hf-rope-ext plan`` end to end (exit status 0 when a plan fits, 1 when none does, 2 for bad input, each bad input
one line naming its flag), its JSON, a shape read from a config.json, and the planner's choice against a hand count
with ``train.memory.model.predict``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hf_rope_ext.cli import main
from hf_rope_ext.train.memory import planner
from hf_rope_ext.train.memory.model import Step, predict, total

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
H100 = "79.6"
LLAMA_1B_CONFIG = {  # the keys of Llama 3.2 1B's config.json that the planner reads, and one it does not
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
}


def plan(*words: str) -> list[str]:
    return ["plan", *words]


def run_json(capsys, *words: str) -> tuple[int, dict]:
    status = main(plan(*words, "--json"))
    return status, json.loads(capsys.readouterr().out)


def error_of(capsys) -> str:
    """The one stderr line of a refused command (argparse's usage lines aside)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_a_plan_that_fits_prints_the_table_and_its_flags(capsys):
    assert main(plan("--model", "Llama 3.1 8B", "--length", "1048576", "--gpus", "4", "--gpu-memory", H100)) == 0
    out = capsys.readouterr().out
    assert out.count("| --no-copies --tiled-mlp --offload-checkpoints |") == 3  # N = 1, 2, 4
    assert "cheapest plan that fits: N=4 with --offload-checkpoints" in out
    assert f"accelerate launch --config_file {planner.FSDP_CONFIG} --num_processes 4 -m hf_rope_ext finetune" in out
    assert "--length 1048576 --grad-checkpointing --sequence-parallel 4 --offload-checkpoints" in out
    assert (ROOT / planner.FSDP_CONFIG).is_file()


def test_one_gpu_needs_no_launcher_and_no_split(capsys):
    status, result = run_json(
        capsys, "--model", "Llama 3.2 1B", "--length", "131072", "--gpus", "1", "--gpu-memory", H100
    )
    assert status == 0 and result["fits"] and result["plan"]["techniques"] == []
    assert result["flags"] == ["--grad-checkpointing"]
    assert result["command"].startswith("hf-rope-ext finetune ")


def test_the_json_has_every_plan_and_the_chosen_one(capsys):
    status, result = run_json(
        capsys, "--model", "Llama 3.1 8B", "--length", "1048576", "--gpus", "16", "--gpu-memory", H100
    )
    assert status == 0
    keys = {"model", "shape", "length", "gpus", "gpu_memory_gib", "host_memory_gib", "margin_gib", "plans"}
    assert set(result) == keys | {"fits", "plan", "flags", "command", "short_gib"}
    assert len(result["plans"]) == 8 * 5  # every combination at N = 1, 2, 4, 8, 16 (16: two copies of each kv head)
    assert set(result["plans"][0]) == {"techniques", "sequence_parallel", "gpu_gib", "host_gib_per_node", "peak_at"} | {
        "fits"
    }
    assert result["host_memory_gib"] == planner.HOST_GIB and result["short_gib"] == {"gpu": 0.0, "host": 0.0}
    chosen = result["plan"]
    assert (chosen["techniques"], chosen["sequence_parallel"], chosen["fits"]) == ([], 8, True)
    assert "--num_machines 2 --num_processes 16" in result["command"]


def test_a_node_holds_eight_gpus_of_host_memory():
    """Host bytes per node: a process's offloaded checkpoints times min(G, 8)."""
    shape = planner.SHAPES["Llama 3.1 8B"]
    per_process = predict(shape, Step(1048576, 8, 16, offload=True))["host"]
    for gpus, on_a_node in ((8, 8), (16, 8), (32, 8)):
        found = planner.plan_of(shape, 1048576, gpus, 8, ("offload",))
        assert found.host_bytes == per_process * on_a_node
    assert planner.plan_of(shape, 1048576, 2, 2, ("offload",)).host_bytes == 2 * per_process * 4


def test_when_none_fits_the_closest_says_what_is_short(capsys):
    words = ("--model", "Llama 3.1 8B", "--length", "16777216", "--gpus", "8", "--gpu-memory", H100)
    assert main(plan(*words)) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("no plan fits; the closest, N=8 with --no-copies --tiled-mlp --offload-checkpoints")
    assert "GPU memory by 114.0 GiB (193.6 GiB per GPU against 79.6)" in last
    assert "host memory by 2048.0 GiB (4096 GiB per node against 2048)" in last
    status, result = run_json(capsys, *words)
    assert status == 1 and not result["fits"] and not any(p["fits"] for p in result["plans"])
    assert result["short_gib"]["gpu"] == pytest.approx(114.0, abs=0.05)


def test_host_memory_limits_offloading(capsys):
    """At 1M tokens on 4 H100s only offloading fits (256 GiB a node of host memory): with 200 GiB none does, and the
    closest plan is one without offloading, short of GPU memory only (91.3 GiB against 79.6 is nearer than 256 GiB
    of host memory against 200)."""
    words = ("--model", "Llama 3.1 8B", "--length", "1048576", "--gpus", "4", "--gpu-memory", H100)
    assert main(plan(*words, "--host-memory", "256")) == 0
    assert main(plan(*words, "--host-memory", "200")) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "the closest, N=4 with --no-copies --tiled-mlp, is short of GPU memory by 11.7 GiB (91.3 GiB per GPU" in last
    assert "host memory" not in last


def test_the_host_can_be_what_is_short(capsys):
    words = ("--model", "Llama 3.1 70B", "--length", "1048576", "--gpus", "8", "--gpu-memory", "140.4")
    status, result = run_json(capsys, *words, "--host-memory", "1000")
    assert status == 1 and result["short_gib"] == {"gpu": 0.0, "host": pytest.approx(280.0)}
    assert result["plan"]["techniques"] == ["offload"]  # every offloading plan needs 1280 GiB: the cheapest of them


def test_the_choice_is_the_first_plan_that_a_hand_count_fits():
    """Llama 3.1 8B, 1M tokens, 4 H100s: in the cost order (techniques, then N), every plan before --offload-checkpoints
    at N = 4 is over the GPU's memory by predict's own count, and that one is within it."""
    shape, tokens, gpus, capacity = planner.SHAPES["Llama 3.1 8B"], 1048576, 4, 79.6
    hand = []
    for techniques in [(), ("lean",), ("tiled",), ("lean", "tiled"), ("offload",)]:
        for n in (1, 2, 4):
            t = tokens // n
            tile = -(-t // -(-t // shape.hidden)) if "tiled" in techniques else 0  # ALST: ceil(t / ceil(t / d))
            step = Step(tokens, n, gpus, 2, 2, 8, offload="offload" in techniques, tile=tile, lean="lean" in techniques)
            hand.append((techniques, n, total(predict(shape, step)) / GIB + 3 <= capacity))
    assert [fits for *_, fits in hand] == [False] * 14 + [True]
    chosen, fits = planner.choose(planner.plans(shape, tokens, gpus), capacity)
    assert fits and (chosen.techniques, chosen.sequence_parallel) == hand[-1][:2]
    expected = total(predict(shape, Step(tokens, 4, 4, offload=True))) + 3 * GIB
    assert chosen.gpu_bytes == expected and chosen.host_bytes == 4 * 32 * 4096 * 2 * (tokens // 4)


def test_the_cost_order_is_the_documented_one():
    assert planner.COMBINATIONS == (
        (),
        ("lean",),
        ("tiled",),
        ("lean", "tiled"),
        ("offload",),
        ("lean", "offload"),
        ("tiled", "offload"),
        ("lean", "tiled", "offload"),
    )
    order = [(p.techniques, p.sequence_parallel) for p in planner.plans(planner.SHAPES["Qwen2.5 7B"], 65536, 8)]
    assert order[:4] == [((), 1), ((), 2), ((), 4), (("lean",), 1)]  # 28 heads, 4 kv: N = 1, 2, 4 (or 28) on 8 GPUs


@pytest.mark.parametrize("as_file", [False, True])
def test_a_config_json_is_read_from_a_folder_or_the_file(tmp_path, capsys, as_file):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_1B_CONFIG))
    model = tmp_path / "config.json" if as_file else tmp_path
    status, result = run_json(capsys, "--model", str(model), "--length", "131072", "--gpus", "2", "--gpu-memory", H100)
    assert status == 0 and result["shape"] == asdict(planner.SHAPES["Llama 3.2 1B"])
    _, named = run_json(capsys, "--model", "Llama 3.2 1B", "--length", "131072", "--gpus", "2", "--gpu-memory", H100)
    assert result["plans"] == named["plans"]


def test_a_config_without_key_value_heads_or_head_dim_takes_transformers_defaults(tmp_path):
    config = {k: v for k, v in LLAMA_1B_CONFIG.items() if k not in ("num_key_value_heads", "head_dim")}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = planner.read_shape(str(tmp_path))
    assert (shape.kv_heads, shape.head_dim) == (32, 64)


def bad_config(folder: Path, text: str) -> str:
    (folder / "config.json").write_text(text)
    return str(folder)


BAD = {
    "length 0": (["--length", "0"], "argument --length: expected an integer >= 1, got '0'"),
    "length negative": (["--length", "-8"], "argument --length: expected an integer >= 1, got '-8'"),
    "gpus 0": (["--gpus", "0"], "argument --gpus: expected an integer >= 1, got '0'"),
    "gpus negative": (["--gpus", "-1"], "argument --gpus: expected an integer >= 1, got '-1'"),
    "gpu memory 0": (["--gpu-memory", "0"], "argument --gpu-memory: expected a number > 0, got '0'"),
    "gpu memory text": (["--gpu-memory", "lots"], "argument --gpu-memory: expected a number > 0, got 'lots'"),
    "host memory negative": (["--host-memory", "-1"], "argument --host-memory: expected a number > 0, got '-1'"),
    "host memory nan": (["--host-memory", "nan"], "argument --host-memory: expected a number > 0, got 'nan'"),
    "unknown shape": (
        ["--model", "Llama 3.1 8b"],
        "error: --model 'Llama 3.1 8b' is neither a known shape (did you mean 'Llama 3.1 8B'?) nor a folder or file "
        "with config.json; known shapes: 'Llama 3.2 1B', 'Llama 3.1 8B', 'Llama 3.1 70B', 'Qwen2.5 7B'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_every_bad_input_is_one_line_naming_its_flag(case, capsys):
    words = {"--model": "Llama 3.1 8B", "--length": "8192", "--gpus": "1", "--gpu-memory": H100}
    change, message = BAD[case]
    words |= dict(zip(change[::2], change[1::2], strict=True))
    assert main(plan(*(w for pair in words.items() for w in pair))) == 2
    line = error_of(capsys)
    assert line.startswith("hf-rope-ext plan: error: ") and message in line, line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (json.dumps({k: v for k, v in LLAMA_1B_CONFIG.items() if k != "intermediate_size"}), "lacks intermediate_size"),
        (json.dumps({**LLAMA_1B_CONFIG, "num_attention_heads": 0}), "lacks num_attention_heads"),
        ("[1, 2]", "lacks hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size"),
        ("{oops", "cannot read it as JSON"),
    ],
)
def test_a_config_json_lacking_keys_is_refused_naming_model(tmp_path, capsys, text, message):
    folder = bad_config(tmp_path, text)
    assert main(plan("--model", folder, "--length", "8192", "--gpus", "1", "--gpu-memory", H100)) == 2
    line = error_of(capsys)
    assert line.startswith(f"hf-rope-ext plan: error: --model {str(Path(folder) / 'config.json')!r}"), line
    assert message in line, line
