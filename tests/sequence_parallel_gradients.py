"""Run under ``torchrun --nproc_per_node N`` (N = 2 or 4) on the CPU (gloo): for every rope type, a 2-layer Llama of
8 query and 2 key-value heads (N = 4 sends each key-value head as two copies), LoRA on q, k, v, o with random B (so
every A has a gradient), one backward split over the N processes (``--sequence-parallel N``'s forward and loss,
gradients averaged as DDP averages them) against one backward on one process reading the whole rows (rank 0), before
any optimizer step. Rows of ROW tokens, a whole number of neither Dual Chunk Attention's chunks (24) nor the two-band
types' windows (8, 10), in three batches: contiguous ids; the same with only the last ANSWER tokens scored (a
retrieval row: every scored token in the last shard); PoSE ids. Rank 0 prints one JSON line per type and batch: the
loss's gap relative to its size, the largest per-tensor gradient gap relative to that tensor's largest entry, and the
smallest such entry. Last, the split model is fed a row padded past its first shard: rank 0 prints every rank's refusal.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from conftest import random_lora_b  # noqa: E402
from sequence_parallel_types import LENGTH, NO_CP, TYPES, average, gradient_gaps, lora_model  # noqa: E402

from hf_rope_ext.train.loop import forward_loss  # noqa: E402
from hf_rope_ext.train.positions import position_ids  # noqa: E402
from hf_rope_ext.train.sequence_parallel import ONE, enable, make_group  # noqa: E402

HEADS = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2)  # head_dim 8, as the 4-head model's
ROWS, ROW, ANSWER, PAD_FROM = 2, 44, 4, 8
BATCHES = ("contiguous", "retrieval", "pose")


def batches() -> dict[str, tuple]:
    """name -> (input ids, position ids, labels or None for every token), each (ROWS, ROW)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 384, (ROWS, ROW), generator=generator)
    contiguous = torch.arange(ROW).repeat(ROWS, 1)
    answer = torch.full_like(ids, -100)
    answer[:, -ANSWER:] = ids[:, -ANSWER:]  # shifted: tokens ROW-ANSWER-1 .. ROW-2 scored, all in the last shard
    pose = position_ids("pose", ROWS, ROW, LENGTH, generator, 3)
    return {"contiguous": (ids, contiguous, None), "retrieval": (ids, contiguous, answer), "pose": (ids, pose, None)}


def model_with_random_b(rope_type: str):
    """``lora_model`` of HEADS with every LoRA B drawn (seeded) instead of peft's zeros."""
    model = lora_model(rope_type, **HEADS)
    return random_lora_b(model, 0.1, seed=1)


def gradients(model, sequence, batch: tuple) -> tuple[float, dict]:
    """One backward of ``batch`` split over ``sequence``: (the processes' mean loss, adapter gradients averaged, zeros
    for a tensor the backward did not reach)."""
    model.zero_grad()
    loss = forward_loss(NO_CP, model, *batch, sequence)
    loss.backward()
    losses = []
    average(model, loss, losses, sequence)
    trained = ((n, p) for n, p in model.named_parameters() if p.requires_grad)
    return losses[0], {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in trained}  # None: 0


def gaps(one: tuple, split: tuple) -> dict:
    """Relative gaps of the loss and of each gradient tensor (max |a - b| / max |a|); the smallest max |a|."""
    (loss_a, grads_a), (loss_b, grads_b) = one, split
    smallest = min(float(g.abs().max()) for g in grads_a.values())
    worst = max(gradient_gaps(grads_a, grads_b).values())
    return {"loss": abs(loss_a - loss_b) / abs(loss_a), "grads": worst, "smallest": smallest}


def compare(rope_type: str, sequence) -> None:
    """Every batch on one process (rank 0) and split; rank 0 prints the gaps."""
    rows = batches()
    if dist.get_rank() == 0:
        model = model_with_random_b(rope_type)
        one = {name: gradients(model, ONE, batch) for name, batch in rows.items()}
    model = model_with_random_b(rope_type)
    disable = enable(model, sequence)
    split = {name: gradients(model, sequence, batch) for name, batch in rows.items()}
    disable()
    if dist.get_rank() == 0:
        for name in rows:
            print(json.dumps({"rope_type": rope_type, "batch": name, **gaps(one[name], split[name])}), flush=True)


def padded_row_refusal(sequence) -> None:
    """The split model fed this rank's shard of a batch whose second row is padding from token PAD_FROM on (every
    shard holds some); rank 0 prints every rank's error (None: none raised)."""
    ids, positions, _ = batches()["contiguous"]
    mask = torch.ones_like(ids)
    mask[1, PAD_FROM:] = 0
    model = model_with_random_b("default")
    disable, refused = enable(model, sequence), None
    try:
        model(
            input_ids=sequence.shard(ids), position_ids=sequence.shard(positions), attention_mask=sequence.shard(mask)
        )
    except ValueError as error:
        refused = str(error)
    disable()
    every = [None] * sequence.size
    dist.all_gather_object(every, refused, group=sequence.group)
    if dist.get_rank() == 0:
        print(json.dumps({"refused": every}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", nargs="+", default=TYPES)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sequence = make_group(dist.get_world_size(), dist.get_world_size(), dist.get_rank())
    for rope_type in args.types:
        compare(rope_type, sequence)
    padded_row_refusal(sequence)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
