"""The package's dynamic frequency types (``dynamic_yarn``) inside the attention function.

transformers' ``dynamic_rope_update`` recomputes frequencies as the sequence grows, but the KV cache holds keys
rotated with the frequencies of the step that produced them (transformers issue 25104), and its reset below
``max_position_embeddings`` restores ``inv_freq`` but not the attention factor. Here the cache holds unrotated
keys, and every call rotates the queries and all keys with the frequencies for the current length
``max(key position) + 1`` and scales the scores by the attention factor squared (cos and sin both carry it).
What still differs from recomputing the whole prefix: keys and values of the second layer on were computed from
hidden states of earlier steps, i.e. under the frequencies in force at those steps.
"""

from __future__ import annotations

from .. import registry
from .scoring import Scorer


class DynamicScorer(Scorer):
    """Plain RoPE scores with the method's frequencies for the current length (``table.SCORERS`` builds one for
    each dynamic frequency type in the registry)."""

    def __init__(self, method: registry.RopeMethod):
        self.method = method

    def frequencies(self, config, layer_type, q_pos, k_pos, device):
        length = int(k_pos.max()) + 1  # positions 0 .. length-1 are in force (cached keys included)
        inv_freq, attention_factor = self.method.frequencies(config, device, length, layer_type)
        return inv_freq.double(), float(attention_factor) ** 2
