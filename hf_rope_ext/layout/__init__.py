"""Interleaved <-> half-rotate RoPE layouts. This package's own names are the tensor-level ones (rows, keys, state
dicts); live models are converted by ``layout.model.convert_layout`` (``hf_rope_ext.convert_layout``) and saved
directories by ``layout.files.convert_directory``, which use the conversions seam and so are imported by name."""

from .keys import projection_of
from .permute import block_rows, head_rows, pair_order
from .state_dict import convert_tensors

__all__ = ["block_rows", "convert_tensors", "head_rows", "pair_order", "projection_of"]
