"""Run under ``torchrun --nproc_per_node N`` (N = 2 or 4) on the CPU (gloo): for every rope type, the evaluation's
split reading of a row (``train.split_reading.read_row``) over the N processes against the model's own full-logits
forward on one process: each token's fp32 loss (cross-entropy of the logits) and argmax prediction. A 2-layer Llama
of 8 query and 2 key-value heads (N = 4 sends each key-value head as two copies), random LoRA B, a row of ROW tokens
(a whole number of neither Dual Chunk Attention's chunks nor the two-band types' windows). Rank 0 prints one JSON
line per type: the largest loss gap relative to the largest loss, and the share of predictions that differ where
the reference's two best logits are more than 1e-4 apart."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from conftest import random_lora_b  # noqa: E402
from sequence_parallel_types import TYPES, lora_model  # noqa: E402

from hf_rope_ext.train.sequence_parallel import make_group  # noqa: E402
from hf_rope_ext.train.split_reading import read_row  # noqa: E402

HEADS = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
ROW = 88


def reference(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(losses, predictions, gap between the two best logits), each (ROW - 1,), from the full logits."""
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0, :-1].float()  # (ROW - 1, vocab)
    top = logits.topk(2, dim=-1).values
    return F.cross_entropy(logits, ids[1:], reduction="none"), logits.argmax(-1), top[:, 0] - top[:, 1]


def main() -> None:
    dist.init_process_group("gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    group = make_group(size, size, rank)
    ids = torch.randint(2, 384, (ROW,), generator=torch.Generator().manual_seed(0))
    for rope_type in TYPES:
        model = random_lora_b(lora_model(rope_type, **HEADS), 0.1, seed=1).eval()
        losses, predicted = read_row(model, ids, group)
        expected, argmax, gap = reference(model, ids)
        clear = gap > 1e-4
        row = {"rope_type": rope_type, "loss": float((losses - expected).abs().max() / expected.abs().max())}
        row["predictions"] = float((predicted != argmax)[clear].float().mean())
        row["tokens"], row["clear"] = len(losses), int(clear.sum())
        if rank == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
