"""Run under ``torchrun --nproc_per_node 2`` on the CPU (gloo): for every rope type given, one LoRA step's loss and
adapter gradients (before any optimizer step) split over the two processes (``--sequence-parallel 2``), plain against
the same split step with every memory technique on (layer inputs offloaded, the MLP in tiles, no copies), the
gradients averaged as DDP averages them. Rank 0 prints one JSON line per type: the loss difference and the largest
per-tensor gradient difference relative to the tensor's largest entry."""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from memory_techniques_steps import step_grads  # noqa: E402
from sequence_parallel_types import gradient_gaps  # noqa: E402

from hf_rope_ext.train.sequence_parallel import make_group  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", nargs="+", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sequence = make_group(2, 2, dist.get_rank())
    for rope_type in args.types:
        plain = step_grads(rope_type, sequence=sequence)
        every = step_grads(rope_type, offload=True, tile=16, no_copies=True, sequence=sequence)
        row = {"rope_type": rope_type, **differences(plain, every)}
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def differences(a, b) -> dict:
    """Loss gap and the largest per-tensor max |a - b| / max |a| over the adapter gradients."""
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    gaps = gradient_gaps(grads_a, grads_b)
    return {"loss": abs(float(loss_a) - float(loss_b)), "grads": max(gaps.values()), "tensors": len(gaps)}


if __name__ == "__main__":
    main()
