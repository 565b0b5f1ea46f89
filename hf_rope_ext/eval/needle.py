"""Needle in a haystack: the passkey needle hidden in real text (lines of the evaluation documents), scored on a
grid of depths x lengths; ``report.plot_heatmap`` draws the grid.
"""

from __future__ import annotations

import torch

from ..store import bundled
from ..util.progress import bar
from .data import resolve_files
from .passkey import compose, generation_hit, passkeys, spread_depths, teacher_forced_hit, tokenize_pieces

TASK = "Below is some source code with an important piece of information hidden inside. Memorize it."
QUESTION = "\n# What is the pass key? The pass key is"


def haystack_lines(data=None, max_chars: int = 200_000) -> list[str]:
    """Lines (with their newlines) of the evaluation documents, in order, up to about ``max_chars`` characters."""
    lines, total = [], 0
    for text in bundled.read_documents(resolve_files(data)):
        for line in text.splitlines(keepends=True):
            lines.append(line)
            total += len(line)
            if total >= max_chars:
                return lines
    return lines


def needle_grid(model, tokenizer, lengths, depths: int = 5, data=None, generate=False, seed=0, progress=True):
    """Accuracy per cell, shape (depths, len(lengths)); and the depths used. One pass key per cell."""
    lines = haystack_lines(data, max_chars=8 * max(lengths))  # generous: every tokenizer spends >= 1 char per token
    depth_list = spread_depths(depths)
    keys = passkeys(len(depth_list) * len(lengths), seed)
    grid = torch.zeros(len(depth_list), len(lengths))
    cells = [(i, j) for j in range(len(lengths)) for i in range(len(depth_list))]
    for i, j in bar(cells, desc="needle", enabled=progress):
        pieces = tokenize_pieces(tokenizer, keys[i * len(lengths) + j], lines, TASK, QUESTION)
        sample = compose(pieces, lengths[j], depth_list[i])
        grid[i, j] = float(generation_hit(model, sample) if generate else teacher_forced_hit(model, sample))
    return grid, depth_list
