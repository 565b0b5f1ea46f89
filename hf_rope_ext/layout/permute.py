"""Row permutations between the two RoPE layouts, as index tensors (no loops over heads or dims).

One head's rotary dims hold d/2 pairs; pair j is
- ``"half"``: rows (j, j + d/2);
- ``"interleaved"``: rows (2j, 2j + 1).
A projection's output rows are blocks of heads ([q heads | k heads | v heads] when fused), each head
``head_dim`` rows whose first ``rotary_dim`` rotate and the rest pass through unchanged.
"""

from __future__ import annotations

import torch

from ..models import HeadShape, check_layout


def pair_order(rotary_dim: int, to: str) -> torch.Tensor:
    """For each row of one head's rotary dims in layout ``to``, the row it comes from in the other layout; [d]."""
    half = rotary_dim // 2
    j = torch.arange(half)
    if check_layout(to, "to") == "interleaved":  # row 2j <- j, row 2j+1 <- j + d/2
        return torch.stack((j, j + half), dim=-1).flatten()
    return torch.cat((2 * j, 2 * j + 1))  # row j <- 2j, row j + d/2 <- 2j+1


def head_rows(heads: int, head_dim: int, rotary_dim: int, to: str, rotate: bool = True) -> torch.Tensor:
    """Source row of every row of ``heads`` consecutive heads; [heads * head_dim]; pass-through dims stay."""
    within = torch.arange(head_dim)
    if rotate:
        within = torch.cat((pair_order(rotary_dim, to), within[rotary_dim:]))
    return (torch.arange(heads)[:, None] * head_dim + within).flatten()


def block_rows(blocks: tuple[str, ...], shape: HeadShape, to: str) -> torch.Tensor:
    """Source row of every output row of a projection made of ``blocks`` ("q", "k", "v"), in that order."""
    sizes = [shape.heads(b) * shape.head_dim for b in blocks]
    offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist()
    parts = [
        offset + head_rows(shape.heads(b), shape.head_dim, shape.rotary_dim, to, rotate=b != "v")
        for b, offset in zip(blocks, offsets, strict=True)
    ]
    return torch.cat(parts)


def permute_rows(tensor: torch.Tensor, index: torch.Tensor, key: str, blocks: tuple[str, ...], shape: HeadShape):
    """``tensor`` [rows, ...] with its rows reordered by ``index``; a row count the config does not give is an error."""
    if tensor.ndim == 0 or tensor.shape[0] != index.numel():
        raise ValueError(
            f"{key}: shape {tuple(tensor.shape)} does not fit the config: blocks {list(blocks)} with "
            f"num_attention_heads={shape.q_heads}, num_key_value_heads={shape.kv_heads}, head_dim={shape.head_dim} "
            f"need {index.numel()} rows"
        )
    return tensor.index_select(0, index.to(tensor.device))
