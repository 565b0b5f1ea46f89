"""The self-contained module ``--remote-code`` exports ship, so stock transformers loads package rope types.

``write_remote_code(directory, config)`` writes ``modeling_hf_rope_ext.py`` (``template.py`` filled in with the
model's stock class, its rope types and the source of every hf_rope_ext module that ``import hf_rope_ext`` can
load, found statically by ``closure``) and returns config.json with ``auto_map``. Nothing of the package is
special-cased: whatever registers a type (frequency functions, attention functions, checkpoint conversions) is
imported by the package itself and so travels with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ...version import __version__
from .closure import module_closure, module_file

MODULE = "modeling_hf_rope_ext"
CLASS = "HfRopeExtForCausalLM"


def package_dir() -> Path:
    """hf_rope_ext/ on disk (read when writing; the vendored copy, which has no files, imports this module too)."""
    return Path(__file__).resolve().parents[2]


def write_remote_code(directory, config: dict) -> dict:
    """Write ``directory/modeling_hf_rope_ext.py``; return ``config`` with ``auto_map`` pointing at it."""
    architecture = stock_architecture(config)
    text = render(architecture, rope_types_of(config), config.get("rope_layout", "half"), vendored_sources())
    (Path(directory) / f"{MODULE}.py").write_text(text, encoding="utf-8")
    return {**config, "auto_map": {"AutoModelForCausalLM": f"{MODULE}.{CLASS}"}}


def stock_architecture(config: dict) -> str:
    """The config's causal-LM class, which must be one of transformers' own."""
    import transformers

    names = config.get("architectures") or []
    found = [n for n in names if n.endswith("ForCausalLM") and hasattr(transformers, n)]
    if not found:
        raise ValueError(f"architectures={names!r} in config.json: no stock transformers *ForCausalLM class to extend")
    return found[0]


def rope_types_of(config: dict) -> tuple[str, ...]:
    """Every rope_type the config names (flat or nested per layer type)."""
    params = config.get("rope_parameters") or {}
    entries = [v for v in params.values() if isinstance(v, dict)] or [params]
    return tuple(sorted({e.get("rope_type", e.get("type", "default")) for e in entries}))


def vendored_sources() -> dict[str, str]:
    """Source of each module ``import hf_rope_ext`` can load, keyed by its dotted path inside the package."""
    return {name: path.read_text(encoding="utf-8") for name, path in module_closure(package_dir()).items()}


def render(architecture: str, rope_types: tuple[str, ...], layout: str, sources: dict[str, str]) -> str:
    """template.py with its placeholders set; the package name carries a hash of the sources."""
    digest = hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:12]
    packages = tuple(k for k in sorted(sources) if module_file(package_dir(), k).name == "__init__.py")
    text = (Path(__file__).parent / "template.py").read_text(encoding="utf-8")
    text = _set(text, "ARCHITECTURE", repr(architecture))
    text = _set(text, "ROPE_TYPES", repr(rope_types))
    text = _set(text, "LAYOUT", repr(layout))
    text = _set(text, "PACKAGE", repr(f"_hf_rope_ext_{__version__.replace('.', '_')}_{digest}"))
    text = _set(text, "PACKAGES", repr(packages))
    body = "".join(f"    {key!r}: {source!r},\n" for key, source in sorted(sources.items()))
    return _set(text, "SOURCES", "{\n" + body + "}")


def _set(text: str, name: str, value: str) -> str:
    """Replace the template line ``NAME = ...  # __NAME__ ...`` by ``NAME = value``."""
    pattern = re.compile(rf"^{name} = .*# __{name}__.*$", flags=re.M)
    new, count = pattern.subn(lambda _: f"{name} = {value}", text)
    if count != 1:
        raise RuntimeError(f"template.py has {count} placeholder lines for {name}")
    return new
