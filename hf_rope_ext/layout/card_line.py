"""The "Rotary layout" sentence of the model cards the package writes: its wording per layout (``LAYOUT_TEXT``, used
by ``publish.cards``) and its rewrite when ``convert-layout`` converts a folder (:func:`relabel_layout`)."""

from __future__ import annotations

import re

from ..store.outputs import MARKER

LAYOUT_TEXT = {
    "half": "pairs (i, i + d/2), transformers' rotate_half",
    "interleaved": "pairs (2i, 2i+1), GPT-J / original LLaMA",
}
LAYOUT_LINE = re.compile(r"^Rotary layout: `\w+` \(.*\)\.$", re.MULTILINE)  # the templates' layout sentence


def relabel_layout(text: str, rope_layout: str) -> str:
    """A card of ours with its "Rotary layout" line stating ``rope_layout`` (other cards are returned unchanged)."""
    if rope_layout not in LAYOUT_TEXT:
        raise ValueError(f"rope_layout={rope_layout!r} is not allowed; expected one of {sorted(LAYOUT_TEXT)}")
    if MARKER not in text:
        return text
    line = f"Rotary layout: `{rope_layout}` ({LAYOUT_TEXT[rope_layout]})."
    return LAYOUT_LINE.sub(lambda _: line, text)
