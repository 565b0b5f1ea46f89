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

from .. import frequencies, registry  # noqa: F401  (the frequency types are registered first)
from .scoring import SCORERS, Scorer


class DynamicScorer(Scorer):
    """Plain RoPE scores with the method's frequencies for the current length."""

    def __init__(self, method: registry.RopeMethod):
        self.method = method

    def frequencies(self, config, layer_type, q_pos, k_pos, device):
        length = int(k_pos.max()) + 1  # positions 0 .. length-1 are in force (cached keys included)
        inv_freq, attention_factor = self.method.frequencies(config, device, length, layer_type)
        return inv_freq.double(), float(attention_factor) ** 2


def register_dynamic(name: str) -> None:
    method = registry.get_method(name)
    if not method.dynamic or method.kind != "frequency":
        raise ValueError(f"rope_type {name!r} is not a dynamic frequency-level type")
    SCORERS[name] = DynamicScorer(method)


for _method in registry.registered():
    if _method.kind == "frequency" and _method.dynamic:
        register_dynamic(_method.name)
