"""Fine-tuning runs on several CPU processes, shared by tests/test_distributed.py (DDP) and tests/test_fsdp.py (FSDP2):
a base model and text to train on, the command's arguments, an ``accelerate launch`` of them with a free port, and
the outputs read back."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import save_byte_llama
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
L0 = 32
# fp32 bound on |adapter(2 processes) - adapter(1 process)|: the two runs differ only in summation order (the
# all-reduce adds two half-batch gradients); measured 8e-6 after 4 steps at lr 1e-2, for weights of size ~1
ATOL = 1e-4


OPTIONS = dict(
    rope_type="ntk_by_parts",
    length=2 * L0,
    max_steps=4,
    lr=1e-2,
    grad_accum=2,
    position_schedule="pose",
    window=L0,
    save_every=2,
    train_norms=True,
)


# before and after figures at lengths the byte tokenizer's passkey prompts fit (at least 251 tokens)
EVALUATION = dict(eval_lengths="256,512", eval_rows=2, passkey_depths=2, eval_far_context=True)
FIGURES = ("perplexity", "last_chunk_loss", "far_context_loss", "far_context_ratio", "passkey_accuracy")


def assert_same_figures(a: Path, b: Path) -> None:
    """eval_results.json of two runs: the same records (when, length), each figure within fp32 rounding (the before
    figures are one model read two ways; the after ones two adapters within the runs' weight bound)."""
    first, second = (json.loads((out / "eval_results.json").read_text()) for out in (a, b))
    assert [(r["when"], r["length"]) for r in first] == [(r["when"], r["length"]) for r in second]
    assert {r["when"] for r in first} == {"before", "after"} and all(f in first[-1] for f in FIGURES)
    for x, y in zip(first, second, strict=True):
        rtol = 1e-5 if x["when"] == "before" else 1e-3
        assert [x[f] for f in FIGURES] == [pytest.approx(y[f], rel=rtol) for f in FIGURES], (x, y)


def loaded(stdout: str) -> list[int]:
    """The ``loaded:`` figures of a launch (``report_loaded``), smallest first. The processes share one pipe, so
    another process's line may follow a figure before its newline: the figures are read wherever they stand."""
    return sorted(map(int, re.findall(r"loaded: (\d+)", stdout)))


def assert_read_once(stdout: str, processes: int) -> None:
    """The ``loaded:`` lines of an FSDP2 launch (tests/fsdp_on_cpu.py): one process holds the whole base model before
    ``prepare``, the others none."""
    held = loaded(stdout)
    assert len(held) == processes and held[:-1] == [0] * (processes - 1) and held[-1] > 0, held


def argv(setup, out, **overrides) -> list[str]:
    options = {**OPTIONS, "model": str(setup / "base"), "data": str(setup / "data"), "out": str(out), **overrides}
    words = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        words += [flag] if value is True else [flag, str(value)]
    return words


def launch(
    words: list[str],
    processes: int = 2,
    engine=("--multi_gpu",),
    program=("-m", "hf_rope_ext", "finetune"),
    env: dict | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """``accelerate launch --multi_gpu --num_processes N -m hf_rope_ext finetune ...`` with CUDA hidden: torchrun's
    N processes, which hf-rope-ext runs on the CPU over gloo (``accelerate launch --cpu`` starts one process).
    ``engine``: the launcher's engine flags; ``program``: what each process runs, before ``words``; ``env``: more
    environment variables (they win); ``check``: the launch must succeed."""
    command = [sys.executable, "-m", "accelerate.commands.launch", *engine, "--num_processes", str(processes)]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return run_on_cpu([*command, "--main_process_port", str(free_port()), *program, *words], env, check)


def free_port() -> int:
    with socket.socket() as probe:  # tests of other checkouts may launch at the same time
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(
    arguments: list[str], processes: int = 2, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node N ...`` on the CPU, one thread per process."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    return run_on_cpu([*command, "--master_port", str(free_port()), *arguments], env, check)


def run_on_cpu(command: list[str], env: dict | None, check: bool = True) -> subprocess.CompletedProcess:
    """``command`` with CUDA hidden, one thread per process, the checkout importable; it must succeed (``check``)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 or not check, done.stderr[-3000:]
    return done


def adapter(out: Path) -> dict:
    return load_file(out / "adapter_model.safetensors")


def log_rows(out: Path) -> list[list[str]]:
    return [line.split(",") for line in (out / "logs" / "train_log.csv").read_text().splitlines()]


def base_and_text(root: Path) -> Path:
    """A saved 2-layer Llama with a byte-level tokenizer (``root/base``, L0 tokens) and three text files (about 15k
    tokens, ``root/data``); returns ``root``."""
    save_byte_llama(root / "base", L0)
    (root / "data").mkdir()
    for name in ("json/decoder.py", "json/encoder.py", "csv.py"):
        (root / "data" / f"{Path(name).stem}.txt").write_text(Path(json.__file__).parents[1].joinpath(name).read_text())
    return root


def one_process_gaps(setup: Path, out: Path, run: dict, batch_size: int) -> tuple[float, float]:
    """(max |adapter - one process's adapter|, max |loss - one process's loss| per step) of the run in ``out``, against
    ``finetune`` in this process with ``run``'s options and ``batch_size`` rows (the same global batch)."""
    from hf_rope_ext.train import FinetuneConfig, finetune

    options = dict(run, model=str(setup / "base"), data=[str(setup / "data")], out=str(out) + "-one")
    if "eval_lengths" in options:  # the command's comma-separated form
        options["eval_lengths"] = [int(n) for n in str(options["eval_lengths"]).split(",")]
    one = finetune(FinetuneConfig(**options, batch_size=batch_size))
    a, b = adapter(Path(options["out"])), adapter(out)
    assert a.keys() == b.keys() and any("layernorm" in k for k in a)  # the norms are in the adapter
    losses = [float(r[4]) for r in log_rows(out)[1:]]
    assert len(losses) == len(one["rows"])
    difference = max(float((a[k] - b[k]).abs().max()) for k in a)
    return difference, max(abs(x - r["loss"]) for x, r in zip(losses, one["rows"], strict=True))


def report_engine(prepare, describe) -> None:
    """In a launched process: make ``prepare.make_accelerator`` print ``engine: <describe(accelerator)>`` once the
    Accelerator exists, so a test can check which engine accelerate really ran."""
    stock = prepare.make_accelerator

    def make_accelerator(*args, **kwargs):
        accelerator = stock(*args, **kwargs)
        print(f"engine: {describe(accelerator)}", flush=True)
        return accelerator

    prepare.make_accelerator = make_accelerator


def report_loaded(prepare) -> None:
    """In a launched process: make ``prepare.base_model`` print ``loaded: <bytes>``, the bytes of parameters the model
    it returns holds in this process: none for a meta parameter, this process's partition for a DeepSpeed ZeRO-3 one
    (its ``ds_tensor``; the parameter itself is then empty)."""
    stock = prepare.base_model

    def held(p) -> int:
        if hasattr(p, "ds_tensor"):
            return p.ds_tensor.numel() * p.ds_tensor.element_size()
        return 0 if p.is_meta else p.numel() * p.element_size()

    def base_model(*args, **kwargs):
        model = stock(*args, **kwargs)
        sys.stdout.write(f"loaded: {sum(map(held, model.parameters()))}\n")  # one write: the line and its newline
        sys.stdout.flush()
        return model

    prepare.base_model = base_model
