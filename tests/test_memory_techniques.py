"""The memory techniques of ``finetune`` (``--offload-checkpoints``, ``--tiled-mlp``, ``--no-copies``) against the
plain step, for every rope type: the loss and every adapter gradient before the optimizer step, on one process and
split over two (``--sequence-parallel 2``, CPU processes over gloo). Offloading moves tensors and computes nothing:
bitwise. Tiles change the matrix products' blocking and the order the adapters' gradients are summed in: per tensor
within 1e-6 of its largest entry. The units are tested on their own in ``test_offload.py``, ``test_tiled_mlp.py`` and
``test_no_copies.py``; the flags of the command in ``test_finetune_options.py``."""

import json
from pathlib import Path

import pytest
import torch
from finetune_launch import torchrun
from memory_techniques_steps import step_grads
from sequence_parallel_types import TYPES, gradient_gaps

ROUNDING = 1e-6  # per tensor, max |a - b| <= ROUNDING * max |a| (fp32)


@pytest.mark.parametrize("rope_type", TYPES)
def test_every_technique_keeps_the_plain_step(rope_type):
    loss, grads = step_grads(rope_type)
    offloaded = step_grads(rope_type, offload=True)
    assert torch.equal(offloaded[0], loss) and all(torch.equal(offloaded[1][k], g) for k, g in grads.items())
    for options in (dict(tile=16), dict(tile=0), dict(offload=True, tile=16, no_copies=True)):
        other_loss, other = step_grads(rope_type, **options)
        assert float((other_loss - loss).abs()) <= ROUNDING * float(loss.abs()), options
        gaps = gradient_gaps(grads, other)
        assert max(gaps.values()) <= ROUNDING, (options, {k: v for k, v in gaps.items() if v > ROUNDING})
    assert len(grads) == 2 * 7 * 2  # A and B of 7 targets in 2 layers: the MLP's adapters are compared too


def test_every_technique_keeps_the_split_step():
    done = torchrun([str(Path(__file__).with_name("memory_techniques_split.py")), "--types", *TYPES])
    rows = {r["rope_type"]: r for r in map(json.loads, filter(lambda x: x.startswith("{"), done.stdout.splitlines()))}
    assert sorted(rows) == sorted(TYPES)
    for row in rows.values():
        assert row["tensors"] == 28 and row["grads"] <= ROUNDING and row["loss"] <= ROUNDING, row
