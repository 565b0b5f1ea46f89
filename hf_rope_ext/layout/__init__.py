"""Interleaved <-> half-rotate RoPE layouts: tensors, state dicts, models, peft adapters, saved directories."""

from .files import Conversion, convert_directory
from .keys import projection_of
from .model import convert_layout
from .permute import block_rows, head_rows, pair_order
from .state_dict import convert_tensors

__all__ = [
    "Conversion",
    "block_rows",
    "convert_directory",
    "convert_layout",
    "convert_tensors",
    "head_rows",
    "pair_order",
    "projection_of",
]
