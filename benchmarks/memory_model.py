"""The memory model of one LoRA step (``hf_rope_ext.train.memory.model``) against every measured step, and how many
GPUs a row of a given length needs for Llama 3.2 1B, 3.1 8B, 3.1 70B and Qwen2.5 7B, every technique allowed
(``hf_rope_ext.train.memory.planner``).

    PYTHONPATH=. .venv/bin/python benchmarks/memory_model.py            # print both tables
    PYTHONPATH=. .venv/bin/python benchmarks/memory_model.py --write    # and write them into docs/finetune.md

Measured steps: the CPU records of ``benchmarks/bench_lora_memory.py`` (``docs/results/lora-memory/*.json``: the live
tensor peak, weights and adapter weights not counted, no optimizer step) and the H200 records of
``benchmarks/bench_finetune_gpu.py`` (``docs/results/gpu/finetune.json``: ``torch.cuda.max_memory_allocated`` over
whole steps, optimizer included). Each record's shape, layers, tokens and processes are read from it; its shape's
sizes from the script that measured it. Arithmetic only: it runs in a second on any machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import textwrap
from pathlib import Path

from hf_rope_ext.train.memory import planner
from hf_rope_ext.train.memory.engine_attention import check_rope_type
from hf_rope_ext.train.memory.model import Step, predict, total

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
PAGE = ROOT / "docs" / "finetune.md"
BLOCK = "memory-model"  # <!-- memory-model:start --> ... <!-- memory-model:end --> in PAGE
# the loss each CPU record's step took (docs/results/lora-memory.md): its commit's bench_lora_memory.py
CPU_LOSS = {"4cb0bf5": "chunked", "dcffd83": "chunked", "a51e791": "head"}
PRE_FIX = "4cb0bf5"  # the attention-level engine before its fix kept copies per piece; the model counts plain attention
GPU_RANK = 16  # bench_finetune_gpu.build: LoRA rank 16 on q/k/v/o


def script(name: str, folder: str = "benchmarks"):
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measured_points() -> list[dict]:
    """Every measured step with its prediction: what the record names, the bytes measured and predicted, where the
    model puts the peak, and a note for the records of the attention-level engine before its fix."""
    points, cpu_shapes = [], script("bench_lora_memory").SHAPES
    for path in sorted((ROOT / "docs" / "results" / "lora-memory").glob("*.json")):
        record = json.loads(path.read_text())
        commit = record["commit"][:7]
        if commit not in CPU_LOSS:
            raise KeyError(f"{path.name}: commit {commit} has no loss path in CPU_LOSS (head or chunked)")
        shape = planner.shape_of(cpu_shapes[record["model_shape"]], record["layers"])
        step = Step(record["length"], record.get("processes", 1), 1, 4, 4, 8, loss=CPU_LOSS[commit], device="cpu")
        step, counted = counted_step(step, record["rope_type"])
        terms = predict(shape, step)  # the live peak counts neither weights nor adapter weights; no optimizer step
        pre_fix = commit == PRE_FIX and record["rope_type"] != "yarn"
        measured = max(r["live_peak_bytes"] for r in record["per_process"])
        point = row(path.stem, "CPU fp32", record["model_shape"], shape, step, terms, measured, pre_fix)
        points.append(point | ({} if counted or pre_fix else {"note": "one-band engine plan, counted as sdpa"}))
    gpu = json.loads((ROOT / "docs" / "results" / "gpu" / "finetune.json").read_text())
    gpu_shapes = script("bench_finetune_gpu").SHAPES
    for record in (r for r in gpu["records"] if "peak_gib" in r):
        shape = planner.shape_of(gpu_shapes[record["shape"]])
        step = Step(record["length"], rank=GPU_RANK, loss="chunked")
        name, device = f"{record['shape']}-{record['kernels']}-{record['length']}", f"{gpu['device']} bf16"
        points.append(row(name, device, record["shape"], shape, step, predict(shape, step), record["peak_gib"] * GIB))
    return points


def counted_step(step: Step, rope_type: str) -> tuple[Step, bool]:
    """The step with its rope type where the model counts that type's attention (``engine_attention``), else the
    step as sdpa's and False (the engine's one-band plan keeps each chunk's pieces: not modelled)."""
    typed = dataclasses.replace(step, rope_type=rope_type)
    try:
        check_rope_type(typed)
    except ValueError:
        return step, False
    return typed, True


def row(name, device, shape_name, shape, step, terms, measured, pre_fix=False) -> dict:
    """One measured point; a CPU record's prediction leaves out what its live peak does not count."""
    predicted = total(terms, ("adapter_grads", "activations")) if step.device == "cpu" else total(terms)
    return {"name": name, "device": device, "shape": shape_name, "layers": shape.layers, "tokens": step.tokens} | {
        "N": step.sequence_parallel,
        "loss": step.loss,
        "measured": measured,
        "predicted": predicted,
        "peak_at": terms["peak_at"],
        "note": "engine before its fix" if pre_fix else "",
    }


def error(p: dict) -> float:
    return p["predicted"] / p["measured"] - 1


def measured_table(points: list[dict]) -> str:
    lines = [
        "| record | device | shape | layers | tokens | N | loss | measured GiB | predicted GiB | error | peak at |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for p in points:
        note = f" ({p['note']})" if p["note"] else ""
        lines.append(
            f"| {p['name']}{note} | {p['device']} | {p['shape']} | {p['layers']} | {p['tokens']} | {p['N']} "
            f"| {p['loss']} | {p['measured'] / GIB:.3f} | {p['predicted'] / GIB:.3f} | {100 * error(p):+.1f}% "
            f"| {p['peak_at']} |"
        )
    return "\n".join(lines)


def report() -> str:
    points = measured_points()
    worst = max(points, key=lambda p: abs(error(p)) if not p["note"] else 0)
    (h100, h100_gib), (h200, h200_gib) = planner.CAPACITY.items()
    title = textwrap.fill(
        f"**How many GPUs for this length.** These are the model's predictions, not GPU measurements. Per GPU "
        f"count, the cheapest plan of `hf-rope-ext plan` (every technique allowed) that fits an {h100} (bold, "
        f"{h100_gib:g} GiB usable), else an {h200} (italic, {h200_gib:g} GiB), else the one closest to fitting an "
        f"{h200}: GiB per GPU ({planner.MARGIN_GIB:g} GiB to spare counted in) / host GiB per node "
        f"({planner.HOST_GIB:g} GiB a node of {planner.NODE_GPUS} GPUs), then N and the techniques (c: `--no-copies`, "
        f"t: `--tiled-mlp`, o: `--offload-checkpoints`).",
        width=120,
        break_on_hyphens=False,
    )
    return (
        f"{measured_table(points)}\n\nLargest error outside the pre-fix records: {100 * error(worst):+.1f}% "
        f"({worst['name']}).\n\n{title}\n\n{planner.gpu_table()}"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"also write the tables into {PAGE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text = report()
    print(text)
    if args.write:
        script("results_at_a_glance", "experiments").replace_block(PAGE, BLOCK, text)


if __name__ == "__main__":
    main()
