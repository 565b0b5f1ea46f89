"""The memory techniques of ``finetune`` (``--offload-checkpoints``, ``--tiled-mlp``, ``--no-copies``) measured on CPU
steps and set against the memory model's predictions, which this script prints before anything is measured.

    PYTHONPATH=. .venv/bin/python benchmarks/memory_techniques.py --predict        # the predictions, a markdown table
    PYTHONPATH=. .venv/bin/python benchmarks/memory_techniques.py --run --out DIR   # 2 threads, or 1 per process
    PYTHONPATH=. .venv/bin/python benchmarks/memory_techniques.py --table DIR     # measured against predicted

Each point is one ``benchmarks/bench_lora_memory.py`` step (float32, LoRA rank 8 on q/k/v/o, activation
checkpointing, finetune's head loss) with a combination of techniques; ``--run`` runs the points round by round
(every point once a round, ``--repeats`` rounds for the points that time the tiles), so that a slow spell of the
machine falls on every combination alike, and writes one JSON record per run. The live peak is the device's bytes;
the offloaded inputs are the host peak (``LivePeak``). In float32 ``--no-copies`` has nothing to drop (no casts, the
norms' inputs are already fp32): its points are left to the half-precision steps of ``tests/test_memory_model.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hf_rope_ext.train.memory.model import Step, predict, total
from hf_rope_ext.train.memory.planner import shape_of
from hf_rope_ext.train.memory.tiled_mlp import default_tile

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
COMBINATIONS = {  # name -> (offload, tiled, no copies)
    "none": (False, False, False),
    "offload": (True, False, False),
    "tiled": (False, True, False),
    "all": (True, True, True),
}


@dataclass(frozen=True)
class Point:
    shape: str  # a shape of bench_lora_memory.SHAPES
    rope_type: str
    length: int
    processes: int
    combination: str
    repeats: int = 1  # rounds this point runs in (the step-time comparison of the tiles: 3)
    layers: int = 4

    @property
    def name(self) -> str:
        return f"{self.shape}-{self.rope_type}-{self.length}-n{self.processes}-{self.combination}"


POINTS = [
    *(Point("llama-16x8", "yarn", 8192, 1, c, 3 if c in ("none", "tiled") else 1) for c in COMBINATIONS),
    *(Point("llama-16x8", "yarn", 8192, 2, c) for c in COMBINATIONS),
    *(Point("llama-16x8", "yarn", 16384, 1, c) for c in COMBINATIONS),
    *(Point("llama-16x8", "yarn", 16384, 2, c) for c in COMBINATIONS),
    *(Point("smollm2-135m", "self_extend", 12288, n, c) for n in (1, 3) for c in ("none", "all")),
    # after the model counts the attention engine's backward: new lengths and types, predicted before they run
    *(
        Point("smollm2-135m", t, n, 1, "all")
        for t, n in (("self_extend", 16384), ("rerope", 12288), ("dual_chunk", 12288))
    ),
]


@functools.cache
def shapes() -> dict:
    """bench_lora_memory.SHAPES: the Llama config keys of each shape the points name."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_lora_memory

    return bench_lora_memory.SHAPES


def step_of(point: Point, hidden: int) -> Step:
    """The model's step for a point: float32 weights and activations, the head loss, on the CPU, the tile ALST's."""
    offload, tiled, lean = COMBINATIONS[point.combination]
    tile = default_tile(hidden, point.length // point.processes) if tiled else 0
    return Step(
        point.length, point.processes, 1, 4, 4, 8, loss="head", device="cpu", offload=offload, tile=tile, lean=lean,
        rope_type=point.rope_type,
    )  # fmt: skip


def predicted(point: Point) -> tuple[float, float, str]:
    """(device bytes the live peak counts, host bytes, the moment of the peak)."""
    shape = shape_of(shapes()[point.shape], point.layers)
    terms = predict(shape, step_of(point, shape.hidden))
    return total(terms, ("adapter_grads", "activations")), terms["host"], terms["peak_at"]


def predictions_table() -> str:
    lines = [
        "| point | shape | rope type | tokens | N | techniques | predicted device GiB | predicted host GiB | peak at |",
        "|---|---|---|---:|---:|---|---:|---:|---|",
    ]
    for p in POINTS:
        device, host, at = predicted(p)
        lines.append(
            f"| {p.name} | {p.shape} | `{p.rope_type}` | {p.length} | {p.processes} | {p.combination} "
            f"| {device / GIB:.3f} | {host / GIB:.3f} | {at} |"
        )
    return "\n".join(lines)


def command(point: Point, out: Path) -> list[str]:
    """The bench_lora_memory.py command of one run of ``point``, its record written to ``out``."""
    offload, tiled, lean = COMBINATIONS[point.combination]
    words = [sys.executable, str(ROOT / "benchmarks" / "bench_lora_memory.py"), "--model-shape", point.shape]
    words += ["--layers", str(point.layers), "--rope-type", point.rope_type, "--length", str(point.length)]
    words += ["--sequence-parallel", str(point.processes), "--json", str(out)]
    return words + ["--offload-checkpoints"] * offload + ["--tiled-mlp"] * tiled + ["--no-copies"] * lean


def run(out: Path) -> None:
    """Every point, round by round; a record already written is not run again (the run resumes)."""
    rounds = max(p.repeats for p in POINTS)
    for index in range(rounds):
        for point in (p for p in POINTS if index < p.repeats):
            path = out / f"{point.name}-r{index}.json"
            if path.exists():
                continue
            print(f"round {index}: {point.name}", flush=True)
            threads = "1" if point.processes > 1 else "2"  # the machine's two cores, whatever the split
            env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(ROOT)}
            subprocess.run(command(point, path), check=True, cwd=ROOT, env=env)


def measured_table(out: Path) -> str:
    """Each point's largest process against the prediction, its step seconds (median over its rounds)."""
    lines = [
        "| point | commit | runs | device GiB | predicted | error | host GiB | predicted | step s (median) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in POINTS:
        records = [json.loads(f.read_text()) for f in sorted(out.glob(f"{p.name}-r*.json"))]
        if not records:
            continue
        largest = [max(r["per_process"], key=lambda x: x["live_peak_bytes"]) for r in records]
        device, host, _ = predicted(p)
        live, host_live = largest[0]["live_peak_bytes"], largest[0]["host_peak_bytes"]
        seconds = statistics.median(x["step_seconds"] for x in largest)
        commits = {r["commit"][:7] + ("" if r["clean"] else "+") for r in records}
        lines.append(
            f"| {p.name} | {', '.join(sorted(commits))} | {len(records)} | {live / GIB:.3f} | {device / GIB:.3f} "
            f"| {100 * (device / live - 1):+.1f}% | {host_live / GIB:.3f} | {host / GIB:.3f} | {seconds:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--predict", action="store_true", help="print the predictions of every point")
    what.add_argument("--run", action="store_true", help="measure every point (writes JSON records into --out)")
    what.add_argument("--table", type=Path, help="measured against predicted, from the records in this folder")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "lora-memory" / "techniques")
    args = parser.parse_args()
    if args.predict:
        print(predictions_table())
    elif args.run:
        args.out.mkdir(parents=True, exist_ok=True)
        run(args.out)
    else:
        print(measured_table(args.table))


if __name__ == "__main__":
    main()
