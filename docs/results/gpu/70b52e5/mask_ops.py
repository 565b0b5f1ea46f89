"""Operations a ReRoPE decode step dispatches with the CUDA kernel's block masks built three ways, counted on a CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/results/gpu/70b52e5/mask_ops.py    # from the repository root

Each piece's mask is built as the kernel builds it (``flex.kernel_block_mask``) or as an earlier commit did, then
the CPU kernel runs the piece; ``benchmarks/decode_ops.py`` counts the last of three steps after 4096 cached tokens:
- "full": 70b52e5 (the lists by query block, and their transpose for a backward, from the piece's range);
- "lean": bdd9ced (the same without the transpose);
- "kept": now (a piece of one row block that cuts nothing takes the kept full lists: no operation).
"""

import sys
from pathlib import Path
from unittest import mock

from torch.nn.attention.flex_attention import BlockMask

sys.path.insert(0, str(Path.cwd() / "benchmarks"))
import decode_ops  # noqa: E402

from hf_rope_ext.attention.engine import flex  # noqa: E402


def from_range(backward: bool):
    """The mask of a piece from its key range, the transpose built or not (70b52e5, bdd9ced)."""

    def build(q, k, v, piece):
        rows, columns = q.shape[2], k.shape[2]
        partly, fully = flex.range_blocks(piece, rows, columns, q.device)
        lists = (*flex.ordered(partly), *flex.ordered(fully))
        mask_mod = flex.range_mask_mod(piece, q.device)
        return BlockMask.from_kv_blocks(
            *lists, BLOCK_SIZE=flex.BLOCK, mask_mod=mask_mod, seq_lengths=(rows, columns), compute_q_blocks=backward
        )

    return build


bare = decode_ops.last_step_ops("rerope", 4096, 100_000, "cpu")
print(f"no masks: {sum(bare.ops.values())} operations a step")
for name, build in (("full", from_range(True)), ("lean", from_range(False)), ("kept", flex.kernel_block_mask)):
    with mock.patch.object(flex, "kernel_block_mask", build):
        counted = decode_ops.last_step_ops("rerope", 4096, 100_000, "cpu", block_masks=True)
    print(f"{name}: {sum(counted.ops.values())} operations a step")
