"""Per-token decoding time of a model at a context length, for the thread count this process runs with: what
``OMP_NUM_THREADS`` does to lm-eval's RULER answers and the package's probes when two jobs share a small CPU.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_decode_threads.py --length 8192     # one job, one thread
    for i in 1 2; do OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_decode_threads.py --length 8192 & done; wait

The model (default: SmolLM2 from ``hf-rope-ext get-smollm2``, float32, as saved) reads ``--length`` random token
ids into a KV cache, then takes ``--steps`` one-token steps; prints one JSON line: threads, length, prefill
seconds, median seconds per generated token. ``--json PATH`` appends it to a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def measure(model, length: int, steps: int) -> dict:
    ids = torch.randint(100, 10_000, (1, length))
    with torch.no_grad():
        start = time.perf_counter()
        cache = model(ids, use_cache=True, logits_to_keep=1).past_key_values
        prefill = time.perf_counter() - start
        token, times = ids[:, -1:], []  # (1, 1)
        for _ in range(steps):
            start = time.perf_counter()
            model(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - start)
    return {"threads": torch.get_num_threads(), "length": length, "prefill_s": round(prefill, 2)} | {
        "decode_s_per_token": round(statistics.median(times), 3)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: SmolLM2 from `hf-rope-ext get-smollm2`)")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="append the record to this file")
    args = parser.parse_args()
    from hf_rope_ext.eval import loading
    from hf_rope_ext.store import smollm2

    model = loading.load_model(args.model or smollm2.ensure(), None, dtype=torch.float32)
    record = measure(model, args.length, args.steps)
    print(json.dumps(record), flush=True)
    if args.json:
        with open(args.json, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
