"""Memory of one LoRA training step: the peak of live tensor bytes (``hf_rope_ext.util.memory_peak.LivePeak``) and the
resident-set peak, for one rope type at one length, on random weights built from a config (no download).

    OMP_NUM_THREADS=2 PYTHONPATH=. .venv/bin/python benchmarks/bench_lora_memory.py \
        --model-shape llama-16x8 --layers 4 --rope-type self_extend --length 16384 --json out.json

The step is what ``finetune`` runs, in float32: LoRA rank 8 on q/k/v/o, activation checkpointing (non-reentrant),
``train.loop.forward_loss`` (the loss taken from the output head's input in chunks, ``train.head_loss``: no full
logits), the backward. An attention-level type runs through the package's attention function under ``sdpa``; a
frequency-level one (``yarn``) through transformers' own sdpa. The live peak counts every storage made during the step
(activations, saved tensors, gradients, the loss chunks, the all-to-all buffers), not the weights, which are reported
as the baseline; the resident peak is sampled every few milliseconds during the step (plus ``ru_maxrss`` for the
whole process). A benchmark: it prints figures and writes a JSON record, it asserts nothing.

The memory techniques of ``finetune`` are options of the same names (``--offload-checkpoints``, ``--tiled-mlp
[TOKENS]``, ``--no-copies``; the last changes a half-precision step only: ``--precision bf16`` builds bf16 weights and
runs the step under bf16 autocast, the adapters fp32, as ``finetune --precision bf16`` does). The live peak is the
device's; offloaded layer inputs are counted apart as the host peak (``LivePeak``'s host bytes).

``--sequence-parallel N`` runs the step in N gloo processes (torchrun, started by the script itself), each row split
over them as ``finetune --sequence-parallel N`` splits it; each process measures its own step, the record keeps them
all and the table shows the largest. The weights are whole on every process here (no FSDP2): the live peak is the
step's own memory, which is what the split divides.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_rope_ext  # noqa: F401  (registers the rope types)
from hf_rope_ext.train.loop import forward_loss
from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.memory.techniques import enable_techniques, tile_model
from hf_rope_ext.train.model import target_rope_parameters
from hf_rope_ext.train.sequence_parallel import ONE, enable, make_group
from hf_rope_ext.util.memory_peak import LivePeak, resident_bytes, resident_peak_bytes
from hf_rope_ext.util.quiet import enable_activation_checkpointing

GIB = 2**30
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# name -> Llama config keys; pretraining length L0 in max_position_embeddings
SHAPES = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "llama-16x8": dict(  # about 0.5B parameters: head_dim 64, 30 layers, a 32k vocabulary, tied embeddings
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=30,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
}
# the parameters of the known case (Self-Extend, window 512, groups of 8); every other key as ``finetune`` sets it
OVERRIDES = {
    "self_extend": {"window": 512, "group_size": 8},
    "xpos": {"scale_base": 512.0},
    "roper": {"value_rotary_factor": 1.0},
}


def build_model(
    shape: str, layers: int | None, rope_type: str, length: int, pretrain: int | None = None, settings=None
):
    """(LoRA model, rope_parameters): random weights of ``shape`` (``pretrain``: another L0) extended to ``length``
    with ``rope_type``, in ``settings.precision``, with the memory techniques ``settings`` asks for."""
    keys = dict(SHAPES[shape])
    theta = keys.pop("rope_theta")
    if layers is not None:
        keys["num_hidden_layers"] = layers
    if pretrain is not None:
        keys["max_position_embeddings"] = pretrain
    config = LlamaConfig(**keys, rope_parameters={"rope_type": "default", "rope_theta": theta})
    params, max_positions = target_rope_parameters(config, rope_type, length, extra=OVERRIDES.get(rope_type))
    config.rope_parameters, config.max_position_embeddings = params, max_positions
    config.validate_rope()
    torch.manual_seed(0)
    dtype = DTYPES[getattr(settings, "precision", "fp32")]
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    tile_model(model, getattr(settings, "tiled_mlp", None))
    model = apply_lora(model, rank=8)
    enable_activation_checkpointing(model, use_reentrant=False)
    enable_techniques(model, getattr(settings, "offload_checkpoints", False), getattr(settings, "no_copies", False))
    model.train()
    return model, params


NO_ENGINE = SimpleNamespace(parallelism_config=None, unwrap_model=lambda model: model)  # what forward_loss reads


def one_step(model, input_ids: torch.Tensor, sequence=ONE, half: bool = False) -> float:
    """``finetune``'s forward and loss of one micro-batch (``train.loop.forward_loss``: the head's loss in chunks,
    this rank's shard of the row under sequence parallelism; ``half``: under bf16 autocast, as accelerate runs a bf16
    step), then the backward; the loss."""
    positions = torch.arange(input_ids.shape[1])[None]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
        loss = forward_loss(NO_ENGINE, model, input_ids, positions, None, sequence)
    loss.backward()
    return float(loss.detach())


class ResidentSampler:
    """The largest resident set seen every ``every`` seconds while the block runs (a thread)."""

    def __init__(self, every: float = 0.005):
        self.every, self.peak, self._stop = every, 0, threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes())
            time.sleep(self.every)

    def __enter__(self):
        self.peak, self._thread = resident_bytes(), threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())


def measure(settings: argparse.Namespace, sequence=ONE) -> dict:
    """One process's record of one step (this rank's shard of the row under ``sequence``, the whole row alone)."""
    model, params = build_model(
        settings.model_shape, settings.layers, settings.rope_type, settings.length, settings.pretrain, settings
    )
    enable(model, sequence)
    vocab = model.get_base_model().config.vocab_size
    input_ids = torch.randint(0, vocab, (1, settings.length), generator=torch.Generator().manual_seed(1))
    gc.collect()
    before = resident_bytes()
    start = time.perf_counter()
    with ResidentSampler() as resident, LivePeak(explain=settings.explain) as live:
        loss = one_step(model, input_ids, sequence, settings.precision == "bf16")
    seconds = time.perf_counter() - start
    rank = sequence.rank
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "rank": rank,
        "live_peak_bytes": live.peak,
        "live_peak_gib": round(live.peak / GIB, 4),
        "live_after_bytes": live.live,
        "host_peak_bytes": live.host_peak,
        "host_peak_gib": round(live.host_peak / GIB, 4),
        "baseline_bytes": live.baseline,
        "resident_before_gib": round(before / GIB, 4),
        "resident_step_peak_gib": round(resident.peak / GIB, 4),
        "ru_maxrss_gib": round(resident_peak_bytes() / GIB, 4),
        "step_seconds": round(seconds, 2),
        "loss": loss,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": trainable,
        "rope_parameters": params,
        "at_peak_gib": {k: round(v / GIB, 4) for k, v in sorted(live.at_peak.items(), key=lambda kv: -kv[1])},
    }


def techniques(settings) -> dict:
    """The memory techniques of the step (``finetune``'s flags), as the record names them."""
    return {
        "offload_checkpoints": settings.offload_checkpoints,
        "tiled_mlp": settings.tiled_mlp,
        "no_copies": settings.no_copies,
    }


def git_state() -> dict:
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "clean": git("status", "--porcelain") == ""}


def largest(record: dict) -> dict:
    """The process record holding the most live memory (the one a device must fit)."""
    return max(record["per_process"], key=lambda r: r["live_peak_bytes"])


def table(records: list[dict]) -> str:
    """A markdown table of records: live and resident peaks of the largest process, the live peak's ratio to yarn's
    (the yarn record of the same shape, length, layers and processes, from the same commit where there is one) and to
    one process's (the same shape, type, length and layers)."""
    where = lambda r: (r["model_shape"], r["length"], r["layers"])  # noqa: E731
    yarn, alone = {}, {}
    for r in sorted(records, key=lambda r: r["commit"]):
        peak = largest(r)["live_peak_bytes"]
        if r["rope_type"] == "yarn":
            yarn.setdefault((*where(r), r.get("processes", 1)), {})[r["commit"]] = peak
        if r.get("processes", 1) == 1:
            alone.setdefault((*where(r), r["rope_type"]), {})[r["commit"]] = peak
    lines = [
        "| commit | shape | layers | length | processes | rope type | live peak GiB | ratio to yarn "
        "| ratio to 1 process | resident step peak GiB | step s |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    order = lambda r: (*where(r), r.get("processes", 1), r["commit"], r["rope_type"] != "yarn", r["rope_type"])  # noqa: E731
    for r in sorted(records, key=order):
        one, processes = largest(r), r.get("processes", 1)
        to_yarn = ratio(one["live_peak_bytes"], yarn.get((*where(r), processes), {}), r["commit"])
        to_one = ratio(one["live_peak_bytes"], alone.get((*where(r), r["rope_type"]), {}), r["commit"])
        lines.append(
            f"| {r['commit'][:7]}{'' if r['clean'] else '+'} | {r['model_shape']} | {r['layers']} | {r['length']} "
            f"| {processes} | `{r['rope_type']}` | {one['live_peak_gib']:.3f} | {to_yarn} | {to_one} "
            f"| {one['resident_step_peak_gib']:.3f} | {one['step_seconds']:.0f} |"
        )
    return "\n".join(lines)


def ratio(value: int, references: dict, commit: str) -> str:
    """value over the reference of ``commit`` (else any one), or '-' where there is none."""
    base = references.get(commit, next(iter(references.values()), None))
    return f"{value / base:.2f}" if base else "-"


def relaunch(processes: int) -> int:
    """This command again as ``processes`` gloo processes on this machine (torchrun), each measuring its shard."""
    import socket

    with socket.socket() as probe:  # a free port for the processes' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    return subprocess.run([*command, "--master_port", str(port), __file__, *sys.argv[1:], "--worker"]).returncode


def measure_processes(settings: argparse.Namespace) -> list[dict] | None:
    """Every process's record (rank 0 gathers them; the other ranks get None); one process alone: its own."""
    if not settings.worker:
        return [measure(settings)]
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    record = measure(settings, make_group(world, world, rank))
    records = [None] * world
    dist.all_gather_object(records, record)
    dist.destroy_process_group()
    return records if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, nargs="+", default=None, help="print a table of these JSON records")
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default="llama-16x8")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the shape's (quick runs)")
    parser.add_argument("--rope-type", default="yarn")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--pretrain", type=int, default=None, help="another pretraining length L0 than the shape's")
    parser.add_argument("--explain", action="store_true", help="bytes live at the peak per creating op")
    parser.add_argument(
        "--sequence-parallel", type=int, default=1, help="N gloo processes, each row split over them (torchrun)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one of the N processes
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp32", help="bf16: weights and autocast")
    parser.add_argument("--offload-checkpoints", action="store_true", help="layer inputs in host memory")
    parser.add_argument("--tiled-mlp", type=int, nargs="?", const=0, default=None, help="MLP tiles (0: ALST's)")
    parser.add_argument("--no-copies", action="store_true", help="no fp32 copies of adapters' and norms' inputs")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    settings = parser.parse_args()
    if settings.table:
        print(table([json.loads(path.read_text()) for path in settings.table]))
        return
    if settings.sequence_parallel > 1 and not settings.worker:
        sys.exit(relaunch(settings.sequence_parallel))
    per_process = measure_processes(settings)
    if per_process is None:  # a worker other than rank 0
        return
    record = {
        "benchmark": "bench_lora_memory",
        **git_state(),
        "model_shape": settings.model_shape,
        "layers": settings.layers or SHAPES[settings.model_shape]["num_hidden_layers"],
        "rope_type": settings.rope_type,
        "length": settings.length,
        "pretrain": settings.pretrain or SHAPES[settings.model_shape]["max_position_embeddings"],
        "processes": settings.sequence_parallel,
        "precision": settings.precision,
        "techniques": techniques(settings),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
        "per_process": per_process,
    }
    one = max(per_process, key=lambda r: r["live_peak_bytes"])  # the process that holds the most
    print(
        f"{settings.model_shape} x{record['layers']} {settings.rope_type} {settings.length}: live peak "
        f"{one['live_peak_gib']:.3f} GiB (weights {one['baseline_bytes'] / GIB:.3f} GiB), resident step peak "
        f"{one['resident_step_peak_gib']:.3f} GiB (before {one['resident_before_gib']:.3f}), host peak "
        f"{one['host_peak_gib']:.3f} GiB, {one['step_seconds']} s"
    )
    for op, gib in list(one["at_peak_gib"].items())[:12]:
        print(f"  {op}: {gib:.3f} GiB at the peak")
    if settings.json is not None:
        settings.json.parent.mkdir(parents=True, exist_ok=True)
        settings.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
