"""Frequency-level extensions in GGUF files, with llama.cpp's rope scaling keys.

llama.cpp reads a model's RoPE scaling from its GGUF metadata (``<arch>`` is ``general.architecture``):

- ``<arch>.rope.scaling.type``: ``linear`` or ``yarn`` (``none`` otherwise);
- ``<arch>.rope.scaling.factor``: s; llama.cpp multiplies every position's angle by 1/s (``linear``), or blends the
  scaled and unscaled frequencies per dimension (``yarn``, with beta_fast 32 and beta_slow 1, and its attention
  factor 1 + 0.1 ln s, the defaults of transformers' ``yarn``);
- ``<arch>.rope.scaling.original_context_length``: L0, the length YaRN's per-dimension ramp is measured against;
- ``<arch>.context_length``: the context the file declares (here the extended s x L0, which ``llama-server`` takes
  as its default and largest ``--ctx-size``);
- ``<arch>.rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow`` / ``attn_factor``: only where the parameters differ
  from those defaults.

:func:`export_gguf` copies a GGUF file (every tensor and key as it is) with these keys set for transformers-style
``rope_parameters``. transformers' GGUF reader ignores the keys for Llama-family files (it reads them only for
gpt-oss), so :func:`rope_parameters_of` reads them back, and ``from_gguf.convert_gguf`` gives a converted model
the rope parameters its file declares. Attention-level types have no GGUF form: llama.cpp has no such kernels.
"""

from __future__ import annotations

from pathlib import Path

TYPES = ("linear", "yarn")  # transformers rope_type == llama.cpp rope.scaling.type
DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}  # YaRN's, in transformers and llama.cpp alike
SUFFIXES = {"beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow", "attention_factor": "attn_factor"}


def field(reader, key: str):
    """The value of metadata ``key`` of a ``GGUFReader``, or None."""
    found = reader.get_field(key)
    return None if found is None else found.contents()


def architecture(reader) -> str:
    return str(field(reader, "general.architecture"))


def scaling_keys(arch: str, params: dict, original: int) -> dict:
    """{GGUF key: (value, GGUFValueType)} for ``params`` (a linear or yarn ``rope_parameters``) on a model trained
    at ``original`` tokens; the declared context becomes factor x original."""
    from gguf import GGUFValueType

    rope_type = params.get("rope_type")
    if rope_type not in TYPES:
        raise ValueError(f"rope_type={rope_type!r}: llama.cpp's GGUF rope scaling takes {list(TYPES)} only")
    factor = float(params["factor"])
    keys = {
        f"{arch}.rope.scaling.type": (rope_type, GGUFValueType.STRING),
        f"{arch}.rope.scaling.factor": (factor, GGUFValueType.FLOAT32),
        f"{arch}.rope.scaling.original_context_length": (int(original), GGUFValueType.UINT32),
        f"{arch}.context_length": (round(factor * original), GGUFValueType.UINT32),
    }
    extra = {k: v for k, v in params.items() if k in SUFFIXES and v is not None and v != DEFAULTS.get(k)}
    keys.update({f"{arch}.rope.scaling.{SUFFIXES[k]}": (float(v), GGUFValueType.FLOAT32) for k, v in extra.items()})
    return keys


def export_gguf(src, dst, params: dict) -> Path:
    """Copy GGUF file ``src`` to ``dst`` with the rope scaling keys of ``params`` (see :func:`scaling_keys`; L0 is
    ``original_max_position_embeddings``, else the context ``src`` declares). ``dst`` must not exist."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise FileExistsError(f"{str(dst)!r} exists; remove it or choose another file")
    reader = gguf.GGUFReader(src)
    arch = architecture(reader)
    original = params.get("original_max_position_embeddings") or field(reader, f"{arch}.context_length")
    keys = scaling_keys(arch, params, int(original))
    metadata = {key: MetadataDetails(kind, value) for key, (value, kind) in keys.items()}
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    try:
        copy_with_new_metadata(reader, writer, metadata, remove_metadata=[])
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
    return dst


def rope_parameters_of(path) -> dict | None:
    """The rope scaling a GGUF file declares, as transformers' ``rope_parameters`` (``rope_theta`` from
    ``<arch>.rope.freq_base``), or None when it declares none."""
    import gguf

    reader = gguf.GGUFReader(Path(path))
    arch = architecture(reader)
    value = lambda suffix: field(reader, f"{arch}.{suffix}")  # noqa: E731
    rope_type = value("rope.scaling.type")
    if rope_type in (None, "none"):
        return None
    if rope_type not in TYPES:
        raise ValueError(f"{str(path)!r}: rope.scaling.type={rope_type!r}; hf-rope-ext reads {list(TYPES)}")
    params = {"rope_type": rope_type, "factor": float(value("rope.scaling.factor"))}
    if value("rope.freq_base") is not None:
        params["rope_theta"] = float(value("rope.freq_base"))
    if rope_type == "yarn" and value("rope.scaling.original_context_length") is not None:
        params["original_max_position_embeddings"] = int(value("rope.scaling.original_context_length"))
    for key, suffix in SUFFIXES.items():
        if value(f"rope.scaling.{suffix}") is not None:
            params[key] = float(value(f"rope.scaling.{suffix}"))
    return params
