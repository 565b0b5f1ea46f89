"""Two CPU processes (DDP over gloo, started by ``accelerate launch`` as a user starts them) train the adapter that
one process trains with the same global batch, resume exactly, keep one RNG state per process, and write each output
once (the main process); PoSE positions are drawn per global micro-batch, so each row gets the same ids either way.
Ctrl-C during a run (a subprocess, as a user runs it) saves a checkpoint whose printed resume command finishes it."""

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from finetune_launch import ATOL, L0, OPTIONS, ROOT, adapter, argv, base_and_text, launch, log_rows, one_process_gaps
from safetensors.torch import load_file

from hf_rope_ext.cli import main
from hf_rope_ext.train import FinetuneConfig, finetune
from hf_rope_ext.train.csv_log import CsvLog


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved 2-layer Llama with a byte-level tokenizer, and three text files (about 15k tokens)."""
    return base_and_text(tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def two(setup):
    out = setup / "two"
    return out, launch(argv(setup, out, batch_size=2))


def test_two_processes_train_the_one_process_adapter(setup, two):
    out, done = two
    options = dict(OPTIONS, model=str(setup / "base"), data=[str(setup / "data")], out=str(setup / "one"))
    one = finetune(FinetuneConfig(**options, batch_size=4))  # one process, the same global batch
    a, b = adapter(setup / "one"), adapter(out)
    assert a.keys() == b.keys()
    difference = max(float((a[k] - b[k]).abs().max()) for k in a)
    # the bound is far below what training moves: steps 3-4 alone change the adapter by more than 20 x ATOL
    middle = load_file(out / "checkpoints" / "step-000002" / "model.safetensors")
    moved = max(float((b[k.replace(".default", "")] - v).abs().max()) for k, v in middle.items() if "lora_" in k)
    print(f"max |adapter(2 processes) - adapter(1 process)| = {difference:.3g}; steps 3-4 moved it {moved:.3g}")
    assert difference < ATOL and moved > 20 * ATOL
    rows = log_rows(out)
    assert [r[0] for r in rows] == ["step", "1", "2", "3", "4"]  # one writer: no row twice
    assert [r[6] for r in rows[1:]] == [str(4 * 2 * L0)] * 4  # tokens per step: 4 rows x 2 micro-batches x window
    losses = [float(r[4]) for r in rows[1:]]
    assert losses == pytest.approx([r["loss"] for r in one["rows"]], abs=1e-4)
    assert done.stdout.count("adapter:") == 1  # the command's report, from the main process only


def test_each_process_keeps_its_own_rng_and_the_main_writes_the_rest(two):
    out, _ = two
    checkpoint = out / "checkpoints" / "step-000002"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == [
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "random_states_1.pkl",
        "scheduler.bin",
        "trainer_state.json",
    ]
    states = [torch.load(checkpoint / f"random_states_{i}.pkl", weights_only=False) for i in (0, 1)]
    assert not torch.equal(states[0]["torch_manual_seed"], states[1]["torch_manual_seed"])  # dropout apart
    plan = json.loads((checkpoint / "trainer_state.json").read_text())["plan"]
    assert plan["processes"] == 2 and plan["batch_size"] == 2


def test_two_processes_resume_exactly(setup, two):
    """Resumed from step 2 by two processes: the uninterrupted two-process adapter and losses, bit for bit."""
    out, _ = two
    resumed = setup / "resumed"
    launch(argv(setup, resumed, batch_size=2, resume_from=out / "checkpoints" / "step-000002"))
    a, b = adapter(out), adapter(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r[4] for r in log_rows(resumed)[1:]] == [r[4] for r in log_rows(out)[3:]]


def test_ctrl_c_saves_a_checkpoint_and_its_resume_command_finishes_the_run(setup):
    """SIGINT during a run: exit 130 with a short message, a checkpoint at the step reached, and a printed command
    that resumes into the same --out, after which the log has every step exactly once. The run waits after its first
    step until the SIGINT has arrived (tests/pause_after_first_step.py), so it cannot end before it, however loaded
    the machine: the signal stops it after step 2."""
    out, steps = setup / "interrupted", 6
    words = ["finetune", *argv(setup, out, batch_size=2, max_steps=steps, save_every=0)]
    command = [sys.executable, str(Path(__file__).with_name("pause_after_first_step.py")), *words]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while (line := process.stdout.readline()) and not line.startswith("paused after step 1"):
        pass
    assert line, process.communicate()[1][-3000:]  # the run ended (an error) before its first step was logged
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    message = stderr[stderr.index("hf-rope-ext finetune: interrupted") :].splitlines()
    assert len(message) == 3 and message[1] == "resume with:"
    done = len(log_rows(out)) - 1
    checkpoint = out / "checkpoints" / f"step-{done:06d}"
    assert done == 2 and (checkpoint / "trainer_state.json").is_file()
    assert not (out / "adapter_model.safetensors").exists()
    resume = shlex.split(message[2])
    assert resume[:4] == ["python", "-m", "hf_rope_ext", "finetune"]
    assert resume[-2:] == ["--resume-from", str(checkpoint)]
    assert main(resume[3:]) == 0  # the printed command's arguments, parsed as the command parses them
    assert [r[0] for r in log_rows(out)[1:]] == [str(s) for s in range(1, steps + 1)]
    assert (out / "adapter_model.safetensors").is_file()


def test_ctrl_c_while_the_last_checkpoint_is_written_stops_the_run_there(setup, monkeypatch):
    """A SIGINT after the last step's stop check (while its checkpoint is written) was swallowed: the run went on to
    evaluate and save and exited 0. It stops there now, with that checkpoint, whose resume finishes the run."""
    from hf_rope_ext.train import loop

    stock = loop.save_checkpoint

    def save_checkpoint(accelerator, directory, step, plan):
        if step == 3:
            signal.raise_signal(signal.SIGINT)  # handled by the run's stop request, as a Ctrl-C would be
        return stock(accelerator, directory, step, plan)

    monkeypatch.setattr(loop, "save_checkpoint", save_checkpoint)
    out = setup / "last-step"
    options = dict(OPTIONS, model=str(setup / "base"), data=[str(setup / "data")], out=str(out), max_steps=3)
    with pytest.raises(loop.Interrupted) as stopped:
        finetune(FinetuneConfig(**options))
    assert stopped.value.step == 3 and stopped.value.checkpoint == out / "checkpoints" / "step-000003"
    assert (stopped.value.checkpoint / "trainer_state.json").is_file() and not (out / "adapter_config.json").exists()
    monkeypatch.undo()
    finetune(FinetuneConfig(**options, resume_from=str(stopped.value.checkpoint)))
    assert [r[0] for r in log_rows(out)[1:]] == ["1", "2", "3"] and (out / "adapter_model.safetensors").is_file()


def test_a_resumed_log_drops_the_rows_after_its_checkpoint(tmp_path):
    """A run that went past its last checkpoint (killed) logged steps that the resumed run logs again."""
    first = CsvLog(tmp_path, enabled=True)
    for step in range(1, 6):
        first.write({"step": step, "loss": 1.0 / step})
    resumed = CsvLog(tmp_path, enabled=True, start_step=3)
    for step in (4, 5, 6):
        resumed.write({"step": step, "loss": 2.0})
    rows = log_rows_of(tmp_path / "train_log.csv")
    assert [(r["step"], r["loss"]) for r in rows] == [("1", "1.0"), ("2", "0.5"), ("3", str(1 / 3))] + [
        (str(s), "2.0") for s in (4, 5, 6)
    ]


def log_rows_of(path: Path) -> list[dict]:
    import csv

    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_two_processes_with_every_memory_technique_train_the_one_process_adapter(setup):
    """DDP with layer inputs offloaded, the MLP in tiles (LoRA on the MLP too: each of its weights' gradients is
    reduced once) and no copies: the adapter of one plain process."""
    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    run = dict(OPTIONS, grad_checkpointing=True, target_modules=targets)
    out = setup / "techniques"
    launch(argv(setup, out, **run, batch_size=2, offload_checkpoints=True, tiled_mlp=16, no_copies=True))
    difference, _ = one_process_gaps(setup, out, dict(run, target_modules=tuple(targets.split(","))), batch_size=4)
    print(f"DDP + techniques: max |adapter(2) - adapter(1)| = {difference:.3g}")
    assert difference < ATOL
