"""One LoRA step's loss and adapter gradients (before any optimizer step) on a tiny GQA Llama at a rope type, with
the memory techniques asked for: shared by ``test_memory_techniques.py`` and the two-process script
``memory_techniques_split.py``."""

import torch
from conftest import random_lora_b
from sequence_parallel_types import LENGTH, NO_CP, average, lora_model

from hf_rope_ext.train.loop import forward_loss
from hf_rope_ext.train.memory.techniques import enable_techniques, tile_model
from hf_rope_ext.train.positions import position_ids
from hf_rope_ext.train.sequence_parallel import ONE, enable

ROWS, WINDOW = 2, 72  # PoSE rows of 72 tokens (not a multiple of the tiles, chunks or windows) reaching LENGTH
GATED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def step_grads(rope_type: str, offload=False, tile=None, no_copies=False, sequence=ONE, targets=GATED):
    """(loss, {adapter name: gradient}) of one step on PoSE rows (positions with skips), gradients averaged over the
    sequence group as DDP would; LoRA on every linear layer, the MLP's included."""
    model = lora_model(rope_type, targets)
    random_lora_b(model, seed=3)  # B away from peft's zeros, so that every A has a gradient to compare
    tile_model(model, tile)
    disable_techniques = enable_techniques(model, offload, no_copies)
    disable_split = enable(model, sequence)
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(2, 384, (ROWS, WINDOW), generator=generator)
    positions = position_ids("pose", ROWS, WINDOW, LENGTH, generator, 3)
    loss = forward_loss(NO_CP, model, ids, positions, None, sequence)
    loss.backward()
    average(model, loss, [], sequence)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    disable_split()
    disable_techniques()
    return loss.detach(), grads
