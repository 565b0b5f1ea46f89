"""Memory of one LoRA training step: the peak of live tensor bytes (``hf_rope_ext.util.memory_peak.LivePeak``) and the
resident-set peak, for one rope type at one length, on random weights built from a config (no download).

    OMP_NUM_THREADS=2 PYTHONPATH=. .venv/bin/python benchmarks/bench_lora_memory.py \
        --model-shape llama-16x8 --layers 4 --rope-type self_extend --length 16384 --json out.json

The step is what ``finetune`` runs, in float32: LoRA rank 8 on q/k/v/o, activation checkpointing (non-reentrant),
the forward through the base model to its last hidden states, the loss in chunks of tokens without full logits
(``train.loss.chunked_causal_lm_loss``), the backward. An attention-level type runs through the package's attention
function under ``sdpa``; a frequency-level one (``yarn``) through transformers' own sdpa. The live peak counts every
storage made during the step (activations, saved tensors, gradients, the loss chunks), not the weights, which are
reported as the baseline; the resident peak is sampled every few milliseconds during the step (plus ``ru_maxrss``
for the whole process). A benchmark: it prints figures and writes a JSON record, it asserts nothing.

One process now; the record's ``processes`` field and ``measure(settings, rank, world)`` leave room for
``--sequence-parallel N`` (N gloo processes, each measuring its own step) later.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_rope_ext  # noqa: F401  (registers the rope types)
from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.loss import chunked_causal_lm_loss
from hf_rope_ext.train.model import target_rope_parameters
from hf_rope_ext.util.memory_peak import LivePeak, resident_bytes, resident_peak_bytes
from hf_rope_ext.util.quiet import enable_activation_checkpointing

GIB = 2**30
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


def build_model(shape: str, layers: int | None, rope_type: str, length: int, pretrain: int | None = None):
    """(LoRA model, rope_parameters): random float32 weights of ``shape`` (``pretrain``: another L0) extended to
    ``length`` with ``rope_type``."""
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
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model = apply_lora(model, rank=8)
    enable_activation_checkpointing(model, use_reentrant=False)
    model.train()
    return model, params


def one_step(model, input_ids: torch.Tensor) -> float:
    """Forward to the last hidden states, chunked loss, backward; the loss."""
    base = model.get_base_model()
    positions = torch.arange(input_ids.shape[1])[None]
    hidden = base.model(input_ids=input_ids, position_ids=positions, attention_mask=torch.ones_like(input_ids))
    loss = chunked_causal_lm_loss(hidden.last_hidden_state, base.lm_head.weight, input_ids)
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


def measure(settings: argparse.Namespace, rank: int = 0, world: int = 1) -> dict:
    """One process's record of one step (``rank`` of ``world``: for sequence parallelism later)."""
    model, params = build_model(
        settings.model_shape, settings.layers, settings.rope_type, settings.length, settings.pretrain
    )
    vocab = model.get_base_model().config.vocab_size
    input_ids = torch.randint(0, vocab, (1, settings.length), generator=torch.Generator().manual_seed(1))
    gc.collect()
    before = resident_bytes()
    start = time.perf_counter()
    with ResidentSampler() as resident, LivePeak(explain=settings.explain) as live:
        loss = one_step(model, input_ids)
    seconds = time.perf_counter() - start
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "rank": rank,
        "live_peak_bytes": live.peak,
        "live_peak_gib": round(live.peak / GIB, 4),
        "live_after_bytes": live.live,
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


def git_state() -> dict:
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "clean": git("status", "--porcelain") == ""}


def table(records: list[dict]) -> str:
    """A markdown table of records: live and resident peaks, the live peak's ratio to yarn's (the yarn record of the
    same length and layers, from the same commit where there is one)."""
    yarn = {}
    for r in sorted(records, key=lambda r: r["commit"]):
        if r["rope_type"] == "yarn":
            yarn.setdefault((r["length"], r["layers"]), {})[r["commit"]] = r["per_process"][0]["live_peak_bytes"]
    lines = [
        "| commit | layers | length | rope type | live peak GiB | ratio to yarn | resident step peak GiB | step s |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in sorted(records, key=lambda r: (r["length"], r["layers"], r["commit"], r["rope_type"] != "yarn")):
        one, ours = r["per_process"][0], yarn.get((r["length"], r["layers"]), {})
        base = ours.get(r["commit"], next(iter(ours.values()), None))
        ratio = f"{one['live_peak_bytes'] / base:.2f}" if base else "-"
        lines.append(
            f"| {r['commit'][:7]}{'' if r['clean'] else '+'} | {r['layers']} | {r['length']} | `{r['rope_type']}` | "
            f"{one['live_peak_gib']:.3f} | {ratio} | {one['resident_step_peak_gib']:.3f} | {one['step_seconds']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, nargs="+", default=None, help="print a table of these JSON records")
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default="llama-16x8")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the shape's (quick runs)")
    parser.add_argument("--rope-type", default="yarn")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--pretrain", type=int, default=None, help="another pretraining length L0 than the shape's")
    parser.add_argument("--explain", action="store_true", help="bytes live at the peak per creating op")
    parser.add_argument("--sequence-parallel", type=int, default=1, help="processes (only 1 so far)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    settings = parser.parse_args()
    if settings.table:
        print(table([json.loads(path.read_text()) for path in settings.table]))
        return
    if settings.sequence_parallel != 1:
        parser.error(f"--sequence-parallel {settings.sequence_parallel}: only 1 process is measured so far")
    record = {
        "benchmark": "bench_lora_memory",
        **git_state(),
        "model_shape": settings.model_shape,
        "layers": settings.layers or SHAPES[settings.model_shape]["num_hidden_layers"],
        "rope_type": settings.rope_type,
        "length": settings.length,
        "pretrain": settings.pretrain or SHAPES[settings.model_shape]["max_position_embeddings"],
        "processes": settings.sequence_parallel,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
        "per_process": [measure(settings)],
    }
    one = record["per_process"][0]
    print(
        f"{settings.model_shape} x{record['layers']} {settings.rope_type} {settings.length}: live peak "
        f"{one['live_peak_gib']:.3f} GiB (weights {one['baseline_bytes'] / GIB:.3f} GiB), resident step peak "
        f"{one['resident_step_peak_gib']:.3f} GiB (before {one['resident_before_gib']:.3f}), {one['step_seconds']} s"
    )
    for op, gib in list(one["at_peak_gib"].items())[:12]:
        print(f"  {op}: {gib:.3f} GiB at the peak")
    if settings.json is not None:
        settings.json.parent.mkdir(parents=True, exist_ok=True)
        settings.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
