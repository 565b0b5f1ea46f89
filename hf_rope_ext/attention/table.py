"""The attention-level rope types' table, importable without torch: name -> the scorer that computes the type.

A method module (``rerope``, ``xpos``, ...) declares its type with :func:`register_attention` and a factory of its
scorer; the scorer (torch) is built on first lookup in :data:`SCORERS`, i.e. when the attention function first runs
the type. So reading the registry (``hf-rope-ext list``) imports neither torch nor transformers. The package's
dynamic frequency types (``dynamic_yarn``) have a scorer too (``dynamic.DynamicScorer``), found from the registry
at lookup, whatever order the method packages were imported in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from .. import registry

if TYPE_CHECKING:
    from .scoring import Scorer

ScorerFactory = Callable[[], "Scorer"]


class ScorerTable(Mapping):
    """rope_type -> Scorer, each built once, on first lookup, from the factory its method module registered."""

    def __init__(self) -> None:
        self._factories: dict[str, ScorerFactory] = {}
        self._built: dict[str, Scorer] = {}

    def add(self, name: str, factory: ScorerFactory) -> None:
        self._factories[name] = factory
        self._built.pop(name, None)

    def _names(self) -> list[str]:
        dynamic = [m.name for m in registry.registered() if m.kind == "frequency" and m.dynamic]
        return list(self._factories) + [n for n in dynamic if n not in self._factories]

    def __getitem__(self, name: str) -> Scorer:
        if name not in self._built:
            if name in self._factories:
                self._built[name] = self._factories[name]()
            elif name in self._names():
                from .dynamic import DynamicScorer

                self._built[name] = DynamicScorer(registry.get_method(name))
            else:
                raise KeyError(f"rope_type {name!r} has no scorer; known: {sorted(self._names())}")
        return self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in self._factories or name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


SCORERS = ScorerTable()


def register_attention(method: registry.RopeMethod, scorer: ScorerFactory) -> registry.RopeMethod:
    """Register an attention-level rope type: its registry entry and the factory of the scorer that computes it."""
    if method.kind != "attention":
        raise ValueError(f"rope_type {method.name!r} has kind={method.kind!r}; only 'attention' types have scorers")
    registry.register(method)
    SCORERS.add(method.name, scorer)
    return method


def windowed(far_query, far_key) -> ScorerFactory:
    """The factory of a two-band scorer (``windowed.WindowedScorer``) over the method's far positions."""

    def build() -> Scorer:
        from .windowed import WindowedScorer

        return WindowedScorer(far_query, far_key)

    return build


def plain_rope(config, device=None, seq_len=None, layer_type=None):
    """The frequencies an attention-level type rotates by (plain RoPE), in ROPE_INIT_FUNCTIONS' signature."""
    from .rotation import base_inv_freq

    return base_inv_freq(config, layer_type, device).float(), 1.0
