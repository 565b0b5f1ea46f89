"""The memory model of one LoRA step (``hf_rope_ext.train.memory_model``) against every measured step, and how many
GPUs a row of a given length needs for Llama 3.2 1B, 3.1 8B and 3.1 70B.

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
import importlib.util
import json
from pathlib import Path

from hf_rope_ext.train.memory_model import Shape, Step, predict, total

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
PAGE = ROOT / "docs" / "finetune.md"
BLOCK = "memory-model"  # <!-- memory-model:start --> ... <!-- memory-model:end --> in PAGE
# the loss each CPU record's step took (docs/results/lora-memory.md): its commit's bench_lora_memory.py
CPU_LOSS = {"4cb0bf5": "chunked", "dcffd83": "chunked", "a51e791": "head"}
PRE_FIX = "4cb0bf5"  # the attention-level engine before its fix kept copies per piece; the model counts plain attention
GPU_RANK = 16  # bench_finetune_gpu.build: LoRA rank 16 on q/k/v/o
# real configs (hidden, intermediate, layers, heads, kv heads, head dim); vocabulary 128256
LLAMAS = {
    "Llama 3.2 1B": Shape(2048, 8192, 16, 32, 8, 64, 128256, tied=True),
    "Llama 3.1 8B": Shape(4096, 14336, 32, 32, 8, 128, 128256, tied=False),
    "Llama 3.1 70B": Shape(8192, 28672, 80, 64, 8, 128, 128256, tied=False),
}
LENGTHS = {"128k": 131072, "512k": 524288, "1M": 1048576}
GPUS = (1, 2, 4, 8, 16, 32)
# usable GiB (nvidia-smi's total) less a margin for what the model leaves out: CUDA context about 1 GiB, NCCL
# buffers and the allocator's fragmentation 2 GiB
MARGIN_GIB = 3.0
CAPACITY = {"H100 80GB": 79.6, "H200 141GB": 140.4}


def script(name: str, folder: str = "benchmarks"):
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shape_of(config: dict, layers: int | None = None) -> Shape:
    """A memory-model shape from a benchmark's LlamaConfig keys."""
    heads = config["num_attention_heads"]
    return Shape(
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        layers=layers or config["num_hidden_layers"],
        heads=heads,
        kv_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"],
        tied=config.get("tie_word_embeddings", True),
    )


def measured_points() -> list[dict]:
    """Every measured step with its prediction: what the record names, the bytes measured and predicted, where the
    model puts the peak, and a note for the records of the attention-level engine before its fix."""
    points, cpu_shapes = [], script("bench_lora_memory").SHAPES
    for path in sorted((ROOT / "docs" / "results" / "lora-memory").glob("*.json")):
        record = json.loads(path.read_text())
        commit = record["commit"][:7]
        if commit not in CPU_LOSS:
            raise KeyError(f"{path.name}: commit {commit} has no loss path in CPU_LOSS (head or chunked)")
        shape = shape_of(cpu_shapes[record["model_shape"]], record["layers"])
        step = Step(record["length"], record.get("processes", 1), 1, 4, 4, 8, loss=CPU_LOSS[commit], device="cpu")
        terms = predict(shape, step)  # the live peak counts neither weights nor adapter weights; no optimizer step
        pre_fix = commit == PRE_FIX and record["rope_type"] != "yarn"
        measured = max(r["live_peak_bytes"] for r in record["per_process"])
        points.append(row(path.stem, "CPU fp32", record["model_shape"], shape, step, terms, measured, pre_fix))
    gpu = json.loads((ROOT / "docs" / "results" / "gpu" / "finetune.json").read_text())
    gpu_shapes = script("bench_finetune_gpu").SHAPES
    for record in (r for r in gpu["records"] if "peak_gib" in r):
        shape, step = shape_of(gpu_shapes[record["shape"]]), Step(record["length"], rank=GPU_RANK, loss="chunked")
        name, device = f"{record['shape']}-{record['kernels']}-{record['length']}", f"{gpu['device']} bf16"
        points.append(row(name, device, record["shape"], shape, step, predict(shape, step), record["peak_gib"] * GIB))
    return points


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


def split(shape: Shape, gpus: int) -> int:
    """Sequence parallelism N over as many of the GPUs as the heads allow (the rest: FSDP2's data-parallel ranks)."""
    return max(k for k in range(1, gpus + 1) if gpus % k == 0 and shape.kv_heads % k == 0 and shape.heads % k == 0)


def per_gpu(shape: Shape, tokens: int, gpus: int) -> float:
    """GiB per GPU of finetune's step (bf16, LoRA rank 8 on q/k/v/o, the head loss, AdamW), FSDP2 over all GPUs."""
    return total(predict(shape, Step(tokens, split(shape, gpus), gpus, 2, 2, 8))) / GIB


def gpu_table() -> str:
    first = next(iter(LLAMAS.values()))  # the three shapes split alike: 8 key-value heads each
    head = " | ".join(f"{g} GPU{'s' if g > 1 else ''} (N={split(first, g)})" for g in GPUS)
    fewest = " | ".join(f"fewest {name.split()[0]}s" for name in CAPACITY)
    lines = [f"| model | tokens | {head} | {fewest} |", "|---|---:|" + "---:|" * (len(GPUS) + len(CAPACITY))]
    for model, shape in LLAMAS.items():
        for label, tokens in LENGTHS.items():
            gib = [per_gpu(shape, tokens, g) for g in GPUS]
            least = [next((str(g) for g, x in zip(GPUS, gib, strict=True) if fits(x, c)), "-") for c in CAPACITY]
            lines.append(f"| {model} | {label} | " + " | ".join([*map(cell, gib), *least]) + " |")
    return "\n".join(lines)


def fits(gib: float, gpu: str) -> bool:
    return gib + MARGIN_GIB <= CAPACITY[gpu]


def cell(gib: float) -> str:
    """Bold: fits an H100; italic: an H200 only."""
    h100, h200 = CAPACITY
    return f"**{gib:.1f}**" if fits(gib, h100) else f"*{gib:.1f}*" if fits(gib, h200) else f"{gib:.1f}"


def report() -> str:
    points = measured_points()
    worst = max(points, key=lambda p: abs(error(p)) if not p["note"] else 0)
    return (
        f"{measured_table(points)}\n\nLargest error outside the pre-fix records: {100 * error(worst):+.1f}% "
        f"({worst['name']}).\n\nGiB per GPU of one step (bold: fits an H100 80GB, italic: an H200 141GB only, with "
        f"{MARGIN_GIB:g} GiB to spare):\n\n{gpu_table()}"
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
