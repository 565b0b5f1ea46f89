"""The package's compiled functions (flex_attention on CUDA, the one-pass rotation) called under a raised dynamo
recompile limit.

Compiled variants kept while the package calls them. One model meets several (each dtype, grad mode, kind of block
mask, a decode step's single query row, a view's storage offset): dynamo's default of 8 was reached on an H200 by one
type's prefill, padding, decode and backward in two dtypes, after which every flex call ran unfused (the whole score
matrix materialized) with only a warning.
"""

from __future__ import annotations

import torch

RECOMPILE_LIMIT = 64
# dynamo names the setting recompile_limit since torch 2.6, cache_size_limit before
LIMIT_NAME = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


def with_recompile_limit(compiled):
    """``compiled`` called under ``RECOMPILE_LIMIT`` (dynamo's setting is left as it was outside the call)."""

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(**{LIMIT_NAME: RECOMPILE_LIMIT}):
            return compiled(*args, **kwargs)

    return call
