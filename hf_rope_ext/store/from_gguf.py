"""GGUF files (llama.cpp, ollama) as model inputs: converted once to a transformers checkpoint folder.

transformers reads a GGUF file itself (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package),
dequantizing every tensor, but the model it returns carries a ``quantization_config`` that ``save_pretrained``
refuses, and each load dequantizes every tensor again. :func:`convert_gguf` writes the dequantized
weights as a plain safetensors checkpoint (the same architecture built from the GGUF's config without the
quantization record), with the tokenizer and a card naming the source file; :func:`model_folder` does that once per
file into a cache folder keyed by the file's content, so every command that takes a model folder takes a ``.gguf``
file too. A file with llama.cpp's rope scaling keys (``gguf_rope``) gets them as its config's ``rope_parameters``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
from pathlib import Path

from . import gguf_rope
from .files import reading
from .outputs import apply_umask

GGUF_REMEDY = "a damaged or incomplete GGUF file (download it again), or one transformers' GGUF reader cannot read"

GGUF_SUFFIX = ".gguf"
CARD = """---
license: {license}
base_model: {base}
tags:
- hf-rope-ext
- gguf
---

# {name}

The weights of `{source}` ({size:.1f} MB, GGUF), dequantized by transformers' GGUF reader and saved as a
{dtype} safetensors checkpoint with its tokenizer by `hf_rope_ext.store.from_gguf.convert_gguf`. The quantization is not
undone: these are the quantized model's weights, not the original checkpoint's.
{note}
- architecture: `{architecture}` ({layers} layers, hidden {hidden}, {heads} query / {kv_heads} kv heads)
- trained context (`max_position_embeddings`): {context}
- rope_parameters: `{rope}`
"""


def is_gguf(path) -> bool:
    """Does ``path`` (a str or path; anything else is not) name a ``.gguf`` file?"""
    return isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(GGUF_SUFFIX)


def cache_root() -> Path:
    """``$HF_ROPE_EXT_CACHE``, else ``$XDG_CACHE_HOME/hf_rope_ext``, else ``~/.cache/hf_rope_ext``."""
    if os.environ.get("HF_ROPE_EXT_CACHE"):
        return Path(os.environ["HF_ROPE_EXT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "hf_rope_ext"


def content_key(path: Path) -> str:
    """The first 16 hex digits of the file's sha256."""
    return file_sha256(path)[:16]


def file_sha256(path: Path) -> str:
    """The file's sha256 in hex (read in 8 MiB blocks)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_gguf(path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"model {str(path)!r} is not a GGUF file (no such file)")
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError(f"model {str(path)!r} is not a GGUF file (it does not start with the GGUF magic)")
    return path


def model_folder(path, dtype: str = "bfloat16") -> Path:
    """The checkpoint folder converted from GGUF file ``path`` (converted on first use, then read from the cache:
    ``cache_root()/gguf/<stem>-<content key>``)."""
    path = check_gguf(path)
    folder = cache_root() / "gguf" / f"{path.stem}-{content_key(path)}-{dtype}"
    if not (folder / "config.json").is_file():
        convert_gguf(path, folder, dtype=dtype)
    return folder


def load_dequantized(path: Path):
    """(model, tokenizer) as transformers reads the GGUF file (float32, with the GGUF quantization record)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with reading(path, GGUF_REMEDY, also=(struct.error, ValueError, KeyError, IndexError)):
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except ImportError as err:  # the gguf package is missing
        raise OSError(f"reading {str(path)!r} needs the gguf package: pip install gguf ({err})") from None
    return model, tokenizer


def convert_gguf(src, dst, dtype: str = "bfloat16", license: str = "other", base: str | None = None, note=""):
    """Write GGUF file ``src`` as a checkpoint folder ``dst`` (safetensors in ``dtype``, tokenizer, README.md card).
    Written into a temporary sibling and renamed at the end: a failure leaves no ``dst`` behind. Returns ``dst``."""
    import torch
    from transformers import AutoModelForCausalLM

    src, dst = check_gguf(src), Path(dst)
    if dst.exists():
        raise FileExistsError(f"{str(dst)!r} exists; remove it or choose another folder")
    model, tokenizer = load_dequantized(src)
    config = model.config
    config.__dict__.pop("quantization_config", None)  # what save_pretrained refuses; the weights are dequantized
    declared = gguf_rope.rope_parameters_of(src)  # llama.cpp's rope scaling keys, which transformers skips
    if declared is not None:
        config.rope_parameters = declared
    clean = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    clean.load_state_dict(model.state_dict())
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    try:
        clean.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(card(src, config, dtype, license, base, note), encoding="utf-8")
        apply_umask(staging)  # mkdtemp makes it 0700 and safetensors its files 0600: the user's usual permissions
        staging.rename(dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dst


def card(src: Path, config, dtype: str, license: str, base: str | None, note: str) -> str:
    return CARD.format(
        license=license,
        base=base or src.name,
        name=src.stem,
        source=src.name,
        size=src.stat().st_size / 1e6,
        dtype=dtype,
        note=f"\n{note}\n" if note else "",
        architecture=config.model_type,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        context=config.max_position_embeddings,
        rope=getattr(config, "rope_parameters", None),
    )
