"""Each decoder layer's MLP over tiles of the sequence (Arctic Long Sequence Training's "TiledMLP"), so that a
training step holds one tile's MLP intermediates at a time instead of the whole sequence's.

The MLP of a Llama-like layer maps each token on its own: ``down(act(gate(x)) * up(x))``, whose intermediates
(gate, up, act(gate), the product) are ``intermediate_size`` wide, several times the hidden size; at long sequences
they are the largest thing a layer's forward and backward make. Tiling: ``x`` of shape (batch, seq, hidden) is cut
by ``torch.split(x, tile, dim=1)`` into consecutive tiles of ``tile`` positions (the last one shorter when ``tile``
does not divide ``seq``), each tile goes through ``torch.utils.checkpoint.checkpoint(forward, tile,
use_reentrant=False)``, and the tiles' outputs are concatenated back along the sequence (same order). The checkpoint
keeps only the tile's input during the forward and recomputes the tile's intermediates when its backward needs
them; autograd runs a later tile's whole backward before an earlier one's, so one tile's intermediates are alive at
a time in the backward too. Non-reentrant checkpoints nest, so this works inside transformers' own checkpointing of
each decoder layer. Without grad (evaluation) each tile is a plain call: nothing is saved, and the intermediates are
again one tile's.

The tiles stay in the model's one autograd graph (no custom ``autograd.Function``): each parameter is a single leaf
whose gradient accumulates into ``.grad`` once per backward, as DDP's reducer and FSDP2's post-backward hooks
expect, and peft's LoRA weights inside the MLP need no special handling.

Why not DeepSpeed's own: ``deepspeed/runtime/sequence_parallel/ulysses_sp.py`` (0.19.8) imports ``deepspeed.comm``
at module level, so it needs deepspeed installed (a test extra here). Its ``TiledMLP`` is an ``autograd.Function``
whose ``backward`` calls ``torch.autograd.backward`` once per shard: on a tiny Llama each MLP weight's ``.grad`` was
accumulated once per shard in one backward and DDP raised "Expected to mark a variable ready only once" (its only
guard, ``param.ds_grad_is_ready``, is for DeepSpeed ZeRO). And the MLP's weights are no inputs of that Function, so
when ``x`` needs no grad (LoRA on the MLP only, embeddings frozen) the output needs none and LoRA gets no gradient.

The default tile, :func:`default_tile`: ALST's rule from the same file, the example in ``TiledMLP``'s docstring,
``num_shards = math.ceil(seqlen / hidden)`` (shards cut with ``torch.chunk``, i.e. ``ceil(seqlen / num_shards)``
positions each); here tokens are the sequence length one process holds (its sequence-parallel shard).

    disable = enable_tiled_mlp(model)       # tile = default_tile(hidden, seq) at each call
    ...
    disable()                               # every MLP is stock again
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

FLAG = "--tiled-mlp"
_MARK = "_hf_rope_ext_tiled_mlp"  # attribute of our installed forward functions (never of a module)


def default_tile(hidden_size: int, tokens: int) -> int:
    """Positions per tile by ALST's rule: ``ceil(tokens / hidden_size)`` tiles, ``ceil(tokens / tiles)`` each
    (at least 1); ``tokens``: the sequence length one process holds."""
    if hidden_size < 1 or tokens < 0:
        raise ValueError(
            f"default_tile(hidden_size={hidden_size}, tokens={tokens}): need hidden_size >= 1, tokens >= 0"
        )
    tiles = max(1, math.ceil(tokens / hidden_size))
    return max(1, math.ceil(tokens / tiles))


def check_tile(tokens) -> int | None:
    """The user's ``--tiled-mlp`` value: None (ALST's default tile) or positions per tile, an integer >= 1 (an int,
    or a string of one, as a command line gives it)."""
    if tokens is None:
        return None
    value = _as_int(tokens)
    if value is None or value < 1:
        raise ValueError(f"{FLAG}={tokens!r}: allowed are no value (ALST's default tile) or an integer >= 1 (tokens)")
    return value


def _as_int(tokens) -> int | None:
    """``tokens`` as an int when it is one (not a bool) or a string of one; else None."""
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return tokens
    if not isinstance(tokens, str):
        return None
    try:
        return int(tokens)
    except ValueError:
        return None


def decoder_mlps(model) -> list[nn.Module]:
    """The child named ``mlp`` of every decoder layer of ``model`` (a transformers model or a wrapper whose
    ``modules()`` reach it: peft, DDP), in the model's order. Decoder layers are found as transformers'
    ``GradientCheckpointingLayer`` instances (every decoder layer class of Llama, Mistral, Qwen2 and the other
    families derives from it, FSDP2's wrapped classes too), whatever attribute path holds the layer list."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    return [layer._modules["mlp"] for layer in layers if isinstance(layer._modules.get("mlp"), nn.Module)]


def enable_tiled_mlp(model, tile: int | None = None) -> Callable[[], None]:
    """Tile every decoder layer's MLP of ``model`` over the sequence, ``tile`` positions per tile (None: ALST's
    default from the input's sequence length at each call). Installs ``forward`` as an instance attribute of each
    MLP (parameter names and state-dict keys unchanged); returns the function that removes it again. ValueError
    when ``model`` has no decoder-layer MLP or its MLPs are tiled already."""
    tile = check_tile(tile)
    mlps = decoder_mlps(model)
    if not mlps:
        raise ValueError(
            f"{type(model).__name__} has no decoder-layer MLP to tile (looked for a child module named 'mlp' of "
            "each transformers GradientCheckpointingLayer)"
        )
    if any(is_tiled(m) for m in mlps):
        raise ValueError(
            f"{type(model).__name__}: the MLPs are tiled already ({FLAG}); call the disable function first"
        )
    previous = [mlp.__dict__.get("forward") for mlp in mlps]  # an instance forward set before (accelerate's hooks)
    for mlp in mlps:
        mlp.forward = _tiled_forward(mlp.forward, tile)
    return lambda: _disable(mlps, previous)


def is_tiled(mlp: nn.Module) -> bool:
    """Whether ``mlp`` carries the forward :func:`enable_tiled_mlp` installs."""
    return getattr(mlp.__dict__.get("forward"), _MARK, False)


def _disable(mlps: list[nn.Module], previous: list[Callable | None]) -> None:
    """Remove the installed forwards, putting back an instance forward that was there before (a second call finds
    none of ours left: nothing to do)."""
    for mlp, forward in zip(mlps, previous, strict=True):
        if not is_tiled(mlp):
            continue
        del mlp.forward
        if forward is not None:
            mlp.forward = forward


def _tiled_forward(forward: Callable, tile: int | None) -> Callable:
    """``forward`` (the MLP's bound forward, x -> y per position) over sequence tiles of ``x``."""

    def tiled(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"{FLAG}: the MLP input must be (batch, seq, hidden); got shape {tuple(x.shape)}")
        size = default_tile(x.shape[-1], x.shape[1]) if tile is None else tile
        if size >= x.shape[1]:
            return forward(x)  # one tile: the stock forward, once
        return torch.cat(tile_outputs(forward, x, size), dim=1)

    setattr(tiled, _MARK, True)
    return tiled


def tile_outputs(forward: Callable, x: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``forward`` of each tile of ``x`` (batch, seq, hidden) along seq, ``size`` positions each (last one shorter),
    in sequence order; with grad each tile is checkpointed (its intermediates recomputed in its backward)."""
    tiles = torch.split(x, size, dim=1)  # views of x: (batch, size, hidden) each, positions in order
    if not torch.is_grad_enabled():
        return [forward(t) for t in tiles]
    return [checkpoint(forward, t, use_reentrant=False) for t in tiles]
