"""hf_rope_ext: RoPE context-extension methods for Hugging Face transformers 5.x.

Importing the package registers its rope types into transformers (idempotently). The one exception is the start
of the ``hf-rope-ext`` command itself, so that ``--help`` and ``list`` need not import torch and transformers:
the command calls :func:`load` before running a subcommand that needs them, and any public name loads on access.
"""

import importlib
import os
import sys

from .version import __version__

__all__ = [
    "available_rope_types",
    "cache_keyword",
    "convert_layout",
    "export",
    "get_method",
    "rope_cache",
    "rope_parameters_for",
    "__version__",
]


METHOD_PACKAGES = ("frequencies", "attention.methods")  # importing one registers each of its methods (plug-ins)


def load_methods() -> None:
    """Fill the table of rope types (``types.registry``): import the package's method modules, each of which
    registers itself. Needs neither torch nor transformers (``hf-rope-ext list``)."""
    for name in METHOD_PACKAGES:
        importlib.import_module(f"{__name__}.{name}")


def load() -> None:
    """Import the public names and register the rope types into transformers (idempotent)."""
    load_methods()
    from . import _transformers
    from ._transformers.cache_layers import rope_cache
    from .layout.model import convert_layout
    from .publish.export import export  # portable export; the function shadows the submodule's attribute name
    from .types import registry, rope_parameters

    globals().update(
        rope_parameters_for=rope_parameters.rope_parameters_for,
        export=export,
        convert_layout=convert_layout,
        available_rope_types=registry.available_rope_types,
        get_method=registry.get_method,
        rope_cache=rope_cache,
        cache_keyword=_transformers.cache_keyword,
    )
    _transformers.install()


def __getattr__(name: str):
    if name in __all__:
        load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_starting() -> bool:
    """True while ``python -m hf_rope_ext`` (runpy sets argv[0] to "-m" while it imports the package) or the
    ``hf-rope-ext`` console script starts."""
    if sys.argv[:1] == ["-m"]:
        orig = getattr(sys, "orig_argv", [])
        pairs = zip(orig, orig[1:], strict=False)
        return any(a == "-m" and b == __name__ for a, b in pairs) or f"-m{__name__}" in orig
    return bool(sys.argv) and os.path.basename(sys.argv[0]).removesuffix(".exe") == "hf-rope-ext"


if not _command_starting():
    load()
