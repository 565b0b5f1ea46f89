"""Time and peak memory of each attention-level rope type against plain RoPE, on a tiny random Llama.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_attention.py --lengths 1024 4096 16384

One no-grad forward pass per (rope type, length) after a warm-up on 64 tokens, keeping only the last logits (so the
vocabulary projection does not dominate). Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` above what was
allocated before the pass; on CPU, the process's peak resident set (VmHWM, reset through /proc/self/clear_refs)
above the resident set before the pass.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

import hf_rope_ext  # noqa: F401  (registers the rope types)

TYPES = {
    "default": {"rope_type": "default"},
    "rerope": {"rope_type": "rerope", "window": 512},
    "leaky_rerope": {"rope_type": "leaky_rerope", "window": 512, "factor": 16.0},
    "self_extend": {"rope_type": "self_extend", "window": 512, "group_size": 8},
    "xpos": {"rope_type": "xpos"},
    "roper": {"rope_type": "roper"},
}


def build(rope: dict, implementation: str, device: str, dtype: torch.dtype, hidden: int, layers: int):
    """A random Llama with 4 query heads and 2 kv heads (head_dim hidden/4), pretrained length 4096."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )
    config._attn_implementation = implementation
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"/proc/self/status has no {field}")


def reset_peak(device: str) -> int:
    """Reset the peak counter; returns the current usage in bytes."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")
    return resident_kib("VmRSS") * 1024


def peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return resident_kib("VmHWM") * 1024


def measure(model, length: int, device: str) -> tuple[float, float]:
    """(seconds, peak MiB above the start) of one forward pass over ``length`` random tokens."""
    ids = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        model(ids[:, :64], logits_to_keep=1)  # warm-up
        start_bytes = reset_peak(device)
        start = time.perf_counter()
        model(ids, logits_to_keep=1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return seconds, (peak(device) - start_bytes) / 2**20


def run_case(args) -> tuple[float, float]:
    """One (rope type, length) in a fresh interpreter, so no earlier pass's memory is counted or reused."""
    command = [sys.executable, __file__, "--case", args.case_name, str(args.case_length), *common_flags(args)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    seconds, mib = json.loads(result.stdout.strip().splitlines()[-1])
    return seconds, mib


def common_flags(args) -> list[str]:
    return [
        "--implementation",
        args.implementation,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
    ]


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=list(TYPES))
    parser.add_argument("--implementation", default="sdpa", choices=["eager", "sdpa"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--case", nargs=2, metavar=("TYPE", "LENGTH"), help="internal: measure one case, print JSON")
    args = parser.parse_args(argv)
    if args.case:
        args.case_name, args.case_length = args.case[0], int(args.case[1])
    return args


def main(argv=None) -> int:
    args = parse(argv)
    dtype = getattr(torch, args.dtype)
    if args.case:
        model = build(TYPES[args.case_name], args.implementation, args.device, dtype, args.hidden, args.layers)
        print(json.dumps(measure(model, args.case_length, args.device)))
        return 0
    rows, baseline = [], {}
    for name, length in tqdm([(n, length) for length in args.lengths for n in args.types], desc="forward passes"):
        args.case_name, args.case_length = name, length
        seconds, mib = run_case(args)
        if name == "default":
            baseline[length] = seconds
        rows.append((name, length, seconds, mib))
    setup = f"{args.implementation}, {args.device}, {args.dtype}, hidden {args.hidden}, {args.layers} layers"
    print(f"\n{setup}, 4 heads (2 kv)")
    print("| rope_type | tokens | forward (s) | x plain RoPE | peak memory (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, length, seconds, mib in rows:
        ratio = f"{seconds / baseline[length]:.2f}" if length in baseline else "-"
        print(f"| {name} | {length} | {seconds:.3f} | {ratio} | {mib:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
