"""Run under ``torchrun --nproc_per_node 2`` on the CPU (gloo): for every rope type, two LoRA optimizer steps (on
contiguous rows, then PoSE rows) split over the two processes (``--sequence-parallel 2``'s forward and loss, gradients
averaged as DDP averages them) against the same steps on one process reading the whole rows. Prints one JSON line per
type from rank 0: the largest loss and LoRA weight differences. ``--local-positions``: the negative control, whose
attention wrapper is fed every shard with this rank's own position ids instead of the gathered row's."""

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from conftest import byte_llama_config  # noqa: E402

import hf_rope_ext  # noqa: E402, F401
from hf_rope_ext.attention import ulysses  # noqa: E402
from hf_rope_ext.train.loop import forward_loss  # noqa: E402
from hf_rope_ext.train.lora import apply_lora  # noqa: E402
from hf_rope_ext.train.model import target_rope_parameters  # noqa: E402
from hf_rope_ext.train.positions import position_ids  # noqa: E402
from hf_rope_ext.train.sequence_parallel import ONE, enable, make_group  # noqa: E402

TYPES = ["default", "linear", "dynamic", "yarn", "longrope", "llama3", *hf_rope_ext.available_rope_types()]
L0, LENGTH, ROWS, WINDOW = 32, 128, 2, 48  # PoSE rows of 48 tokens whose positions reach 128 (4 x L0)
EXTRA = {  # keys the built-in types require that target_rope_parameters cannot derive
    "longrope": {"short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.0, 2.0, 3.0, 4.0]},
    "xpos": {"scale_base": 64},
    "roper": {"value_rotary_factor": 0.5},
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": L0},
}
NO_CP = SimpleNamespace(parallelism_config=None, unwrap_model=lambda model: model)  # what forward_loss reads


def lora_model(rope_type: str, targets=("q_proj", "k_proj", "v_proj", "o_proj"), **overrides):
    """A 2-layer GQA Llama (4 query, 2 key-value heads unless ``overrides`` of its config say otherwise) at
    ``rope_type`` for LENGTH, LoRA on ``targets``, seeded."""
    from transformers import AutoModelForCausalLM

    config = byte_llama_config(max_position_embeddings=L0, attn_implementation="sdpa", use_cache=False, **overrides)
    params, config.max_position_embeddings = target_rope_parameters(
        config, rope_type, LENGTH, None, EXTRA.get(rope_type)
    )
    config.rope_parameters = params
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model = apply_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=targets)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def train(rope_type: str, sequence) -> tuple[list[float], dict]:
    """Two AdamW steps on the same rows; the losses and the final LoRA weights."""
    model = lora_model(rope_type)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    disable, losses = enable(model, sequence), []
    for step in range(2):
        generator = torch.Generator().manual_seed(step)
        ids = torch.randint(2, 384, (ROWS, WINDOW), generator=generator)
        # step 0: ids 0..47, whose first shard stays below L0 (a dynamic type's length differs by shard); step 1: PoSE
        positions = (
            position_ids("pose", ROWS, WINDOW, LENGTH, generator, 3) if step else torch.arange(WINDOW).repeat(ROWS, 1)
        )
        loss = forward_loss(NO_CP, model, ids, positions, None, sequence)
        loss.backward()
        average(model, loss, losses, sequence)
        optimizer.step()
        optimizer.zero_grad()
    disable()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def average(model, loss, losses: list, sequence) -> None:
    """What DDP does over the processes: gradients averaged; the logged loss is the processes' mean."""
    shared = loss.detach().clone()
    if sequence.size > 1:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= sequence.size
        dist.all_reduce(shared)
        shared /= sequence.size
    losses.append(float(shared))


def gradient_gaps(a: dict, b: dict) -> dict[str, float]:
    """Per tensor of ``a``: max |a - b| / max |a| (the reference's largest entry; a zero tensor counts as 1e-30)."""
    return {k: float((a[k] - b[k]).abs().max()) / max(float(a[k].abs().max()), 1e-30) for k in a}


def local_positions(x, group):
    """The negative control's gather: this rank's ids in every shard's place."""
    return x.repeat(1, dist.get_world_size(group))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", nargs="+", required=True)
    parser.add_argument("--local-positions", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sequence = make_group(dist.get_world_size(), dist.get_world_size(), dist.get_rank())
    if args.local_positions:
        ulysses.gather_row = local_positions
    for rope_type in args.types:
        one_losses, one_weights = train(rope_type, ONE)
        losses, weights = train(rope_type, sequence)
        loss_gap = max(abs(a - b) for a, b in zip(one_losses, losses, strict=True))
        weight_gap = max(float((one_weights[k] - weights[k]).abs().max()) for k in weights)
        moved = max(
            float((one_weights[k] - w).abs().max())
            for k, w in lora_model(rope_type).state_dict().items()
            if k in weights
        )
        if dist.get_rank() == 0:
            row = {"rope_type": rope_type, "loss": loss_gap, "weights": weight_gap, "moved": moved}
            print(json.dumps({**row, "losses": losses}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
