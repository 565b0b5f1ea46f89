"""Memory of each process while an FSDP2 or ZeRO-3 fine-tuning run loads its base model and shards it, read once
against read everywhere, on P CPU processes over gloo (accelerate's FSDP2 path, as ``tests/fsdp_on_cpu.py`` runs it;
DeepSpeed's, as ``tests/deepspeed_on_cpu.py`` runs it).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fsdp_loading.py --processes 2 4 \
        --json docs/results/fsdp-loading/record.json
    PYTHONPATH=. .venv/bin/python benchmarks/bench_fsdp_loading.py --engine zero3 --processes 2 4 \
        --json docs/results/fsdp-loading/zero3.json

The base is a Llama built from a config (about 155M parameters, 620 MB in fp32: 8 layers of hidden 1024, a 32000-row
embedding and head, untied), saved with a byte-level tokenizer; each launch is ``hf-rope-ext finetune`` with
``examples/accelerate/fsdp.yaml`` (FSDP2, ``cpu_ram_efficient_loading: true``) for one step. Two ways to load:

- ``everywhere``: every process reads the whole checkpoint and moves it to its device, then accelerate's ``prepare``
  broadcasts the main process's weights into the shards (the control: what DDP and ZeRO-3 runs still do);
- ``once``: ``train.loading``: the main process reads, the others build on the meta device.

With ``--engine zero3`` the launch uses ``examples/accelerate/deepspeed_zero3.yaml``; ``everywhere`` is its
``zero3_init_flag: false`` (every process loads the whole model, ``prepare`` partitions it) and ``once`` its
``zero3_init_flag: true`` (the model partitioned as transformers builds it under ``zero.Init``, the main process
reading the values). A ZeRO-3 parameter's bytes are those of its partition (``ds_tensor``).

Per process: its resident memory just before the base model is loaded (the baseline: interpreter, libraries, data),
the peak resident memory (``ru_maxrss``) once ``prepare`` has sharded the model, the live bytes of its parameters
after loading (meta tensors hold none) and of its local shards after ``prepare``. The figure that matters is the
peak beyond the baseline against the whole model (W) and 1/P of it plus the largest tensor (the embedding), the most a
process that does not read should hold. A benchmark: it prints figures and writes a JSON record, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=32,
    tie_word_embeddings=False,
)
CONFIGS = {"fsdp2": "fsdp.yaml", "zero3": "deepspeed_zero3.yaml"}
RUN = ["--rope-type", "ntk_by_parts", "--length", "64", "--max-steps", "1", "--batch-size", "1"]


def resident() -> int:
    """This process's resident bytes now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    """This process's peak resident bytes so far (Linux reports kibibytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def live_bytes(model) -> int:
    """Bytes of the parameters this process holds (its local shard of a DTensor, its ZeRO-3 partition; none for a meta
    tensor)."""
    total = 0
    for parameter in model.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else getattr(parameter, "ds_tensor", parameter)
        total += 0 if local.is_meta else local.numel() * local.element_size()
    return total


def deepspeed_on_cpu() -> None:
    """DeepSpeed's process group on gloo and an Accelerator built as on a GPU (``cpu=False``): what
    ``tests/deepspeed_on_cpu.py`` does, so that accelerate runs DeepSpeed on CPU processes."""
    import accelerate
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    stock = accelerate.Accelerator

    class Accelerator(stock):
        def __init__(self, *args, cpu=False, **kwargs):
            super().__init__(*args, cpu=False, **kwargs)

    accelerate.Accelerator = Accelerator


def inner(engine: str, way: str, argv: list[str]) -> int:
    """One launched process: FSDP2 or ZeRO-3 on the CPU (as the tests run them), ``way`` of loading, the figures
    printed."""
    if engine == "zero3":
        deepspeed_on_cpu()
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType

    from hf_rope_ext.cli import main
    from hf_rope_ext.train import loading, prepare
    from hf_rope_ext.util.memory_peak import LivePeak

    state = PartialState(cpu=True)
    if engine == "fsdp2":
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    if way == "everywhere":  # under ZeRO-3 the launcher's zero3_init_flag says it
        loading.reads_once = lambda accelerator: False
    row = {"way": way, "rank": state.process_index, "processes": state.num_processes}
    stock_base, stock_prepare = prepare.base_model, Accelerator.prepare

    live = LivePeak()

    def base_model(*args, **kwargs):
        row.update(baseline=resident(), peak_before=peak())
        live.__enter__()  # left once prepare has sharded the model
        model = stock_base(*args, **kwargs)
        row.update(loaded=live_bytes(model), loading_peak=peak(), loading_live_peak=live.peak)
        return model

    def prepared(self, *args, **kwargs):
        out = stock_prepare(self, *args, **kwargs)
        if "peak" not in row:
            live.__exit__(None, None, None)
            row.update(peak=peak(), live_peak=live.peak, live_after=live.live)
            row["shards"] = live_bytes(out[0] if isinstance(out, (tuple, list)) else out)
            print("ROW " + json.dumps(row), flush=True)
        return out

    prepare.base_model, Accelerator.prepare = base_model, prepared
    return main(argv)


def save_base(root: Path) -> tuple[Path, int, int]:
    """The base model and text to train on under ``root``; returns (model folder, its bytes, its largest tensor)."""
    import torch
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model.save_pretrained(root / "base")
    ByT5Tokenizer().save_pretrained(root / "base")
    (root / "data").mkdir()
    (root / "data" / "text.txt").write_text(Path(json.__file__).read_text() * 4)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return root / "base", sum(sizes), max(sizes)


def launch(root: Path, engine: str, way: str, processes: int) -> list[dict]:
    """One run of ``processes`` CPU processes on ``engine`` loading ``way``; its rows, in rank order."""
    config = ROOT / "examples" / "accelerate" / CONFIGS[engine]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += ["--num_processes", str(processes), "--num_machines", "1", "--mixed_precision", "no"]
    if engine == "zero3":
        command += ["--gradient_accumulation_steps", "1", "--zero3_init_flag", str(way == "once").lower()]
    command += ["--dynamo_backend", "no", "--main_process_port", str(29700 + processes), __file__]
    out = root / f"out-{engine}-{way}-{processes}"
    command += ["--inner", engine, way, "finetune", "--model", str(root / "base"), "--data", str(root / "data")]
    command += ["--out", str(out), *RUN]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env |= {"DS_ACCELERATOR": "cpu"} if engine == "zero3" else {}
    done = subprocess.run(command + ["--no-progress"], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    rows = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
    return sorted(rows, key=lambda r: r["rank"])


def table(rows: list[dict], weights: int, largest: int) -> str:
    """Per process, MiB: the resident baseline, the resident peak beyond it, the peak of live tensors made while loading
    and sharding (``LivePeak``), the parameters held after loading and after sharding, the two peaks once the model is
    loaded (before ``prepare``), and the bound W/P + largest."""
    mib = 2**20
    head = ("P", "loading", "rank", "resident before", "resident peak beyond", "live peak", "loaded", "shards")
    head += ("loading: resident peak beyond", "loading: live peak")
    lines = ["| " + " | ".join((*head, "W/P + largest")) + " |"]
    lines.append("|---:|---|" + "---:|" * (len(head) - 1))
    for r in rows:
        bound = (weights / r["processes"] + largest) / mib
        figures = (r["baseline"], r["peak"] - r["baseline"], r["live_peak"], r["loaded"], r["shards"])
        figures += (r["loading_peak"] - r["baseline"], r["loading_live_peak"])
        cells = " | ".join(f"{x / mib:.0f}" for x in figures)
        lines.append(f"| {r['processes']} | {r['way']} | {r['rank']} | {cells} | {bound:.0f} |")
    return "\n".join(lines)


def outer(args) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, weights, largest = save_base(root)
        ways = ("everywhere", "once")
        rows = [r for p in args.processes for way in ways for r in launch(root, args.engine, way, p)]
    print(table(rows, weights, largest))
    record = {"commit": commit, "engine": args.engine, "shape": SHAPE, "weights": weights, "largest": largest}
    record["rows"] = rows
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--inner":
        code = inner(sys.argv[2], sys.argv[3], sys.argv[4:])
        sys.stdout.flush()
        os._exit(code)  # without the interpreter's teardown, where a DeepSpeed CPU process may abort (as in the tests)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(CONFIGS), default="fsdp2")
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--json", help="write the record here")
    outer(parser.parse_args())
