"""Remote code written by `hf-rope-ext export --remote-code`: loads this model in stock transformers.

`AutoModelForCausalLM.from_pretrained(<this folder or repo>, trust_remote_code=True)` imports this file (through
`auto_map` in config.json). It carries a copy of the hf_rope_ext modules that register the model's rope types
(SOURCES, imported under a private package name from memory), registers them unless they are already registered
(hf_rope_ext itself imported), and subclasses the stock model class unchanged. hf_rope_ext need not be installed.
"""

import importlib.abc
import importlib.util
import sys

import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ARCHITECTURE = "__ARCHITECTURE__"  # __ARCHITECTURE__ the stock class this model is
ROPE_TYPES = ()  # __ROPE_TYPES__ the rope types config.json names
LAYOUT = "half"  # __LAYOUT__ config.rope_layout: "interleaved" weights need the package's load-time conversion
PACKAGE = "__PACKAGE__"  # __PACKAGE__ private name of the vendored copy (version and content hash in it)
PACKAGES = ()  # __PACKAGES__ keys of SOURCES that are packages ("" is the top-level __init__.py)
SOURCES = {}  # __SOURCES__ module path relative to the package ("frequencies.ntk") -> its source


def _key(fullname):
    """The SOURCES key of a module name under PACKAGE, or None for any other module."""
    if fullname == PACKAGE:
        return ""
    return fullname[len(PACKAGE) + 1 :] if fullname.startswith(PACKAGE + ".") else None


class _VendoredSources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports PACKAGE and its submodules from SOURCES."""

    package = PACKAGE

    def find_spec(self, fullname, path=None, target=None):
        key = _key(fullname)
        if key is None or key not in SOURCES:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=key in PACKAGES)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        key = _key(module.__name__)
        exec(compile(SOURCES[key], f"<{PACKAGE}:{key or '__init__'}>", "exec"), module.__dict__)


def _register_rope_types() -> None:
    """Import the vendored package (which registers everything) unless hf_rope_ext already did what is needed."""
    package_loaded = sys.modules.get("hf_rope_ext") is not None
    if all(name in ROPE_INIT_FUNCTIONS for name in ROPE_TYPES) and (LAYOUT == "half" or package_loaded):
        return
    if not any(getattr(finder, "package", None) == PACKAGE for finder in sys.meta_path):
        sys.meta_path.append(_VendoredSources())
    importlib.import_module(PACKAGE)


_register_rope_types()


class HfRopeExtForCausalLM(getattr(transformers, ARCHITECTURE)):
    """The stock class, unchanged: the rope types it needs are registered above."""
