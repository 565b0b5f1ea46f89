"""Portable export: rewrite a model's rope config into the stock form other engines read, when exactly equivalent.

Lowerings (each checked numerically with transformers' own rotary module before anything is written):

| this package | stock form |
| --- | --- |
| ``ntk`` | ``default`` with the scaled ``rope_theta`` b * s^(d/(d-2)) |
| ``ntk_by_parts`` | ``yarn`` with ``attention_factor`` 1 (same betas, L0, truncate) |
| any other static frequency-level type (``part_ntk``) | ``longrope`` with short == long factors theta_i / inv_freq_i |
| transformers' own types | unchanged |

Dynamic and attention-level types have no stock form: they are exported only with ``remote_code=True``, which
ships a self-contained module (``auto_map``) that stock transformers loads with ``trust_remote_code=True``.
The source directory is only read; the result is staged beside ``dst`` and moved into place at the end; an
existing ``dst`` is written only with ``overwrite`` and then keeps every file the export does not write.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..frequencies.common import rope_setup
from ..frequencies.ntk import ntk_base
from ..models import find_family
from ..store.files import check_folder, read_json
from ..store.outputs import Staged
from ..types.registry import BUILTIN_TYPES, get_method
from ..util.progress import bar
from .cards import write_model_card
from .export_check import NotLowerable, check_equivalent
from .remote_code import write_remote_code

SKIPPED_FILES = ("config.json", "README.md")  # rewritten / regenerated; every other top-level file is copied


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    mode: str  # "stock" (already stock), "lowered" or "remote-code"
    source_rope_parameters: dict
    rope_parameters: dict
    max_rel_error: float | None  # measured inv_freq difference of a lowering (None when nothing was lowered)
    output_notes: tuple[str, ...] = ()  # files of DST kept or removed as stale (see hf_rope_ext.store.outputs)


def export(
    src,
    dst,
    *,
    remote_code: bool = False,
    overwrite: bool = False,
    base_model: str | None = None,
    license: str | None = None,
    notes: str | None = None,
) -> ExportResult:
    """Write ``src`` (a saved model directory) to ``dst`` in a form stock transformers loads without hf_rope_ext."""
    src, dst = Path(src), Path(dst)
    config = read_model_config(src)
    check_paths(src, dst)
    stage = Staged(dst, overwrite, "DST", writes_card=True)
    with stage as staging:
        result = _build(src, staging, config, remote_code)
        _write_card(staging, result, str(dst.resolve()), base_model, license, notes)
    return ExportResult(dst, *result, output_notes=tuple(stage.summary()))


def _build(src: Path, staging: Path, config: dict, remote_code: bool) -> tuple:
    source = dict(config.get("rope_parameters") or {})
    copy_files(src, staging)
    try:
        check_layout(config)
        lowered = lower_config(config)
    except NotLowerable as err:
        if not remote_code:
            raise NotLowerable(f"{err}; pass --remote-code to ship it as trust_remote_code") from None
        write_json(staging / "config.json", write_remote_code(staging, config))
        return ("remote-code", source, source, None)
    write_json(staging / "config.json", lowered)
    error = check_equivalent(src, staging)
    mode = "stock" if lowered.get("rope_parameters") == source else "lowered"
    return (mode, source, lowered.get("rope_parameters") or {}, error)


# ---------------------------------------------------------------------------------------------------------------
# lowering


def lower_config(config: dict) -> dict:
    """config.json with stock rope_parameters, plus legacy ``rope_scaling`` / top-level ``rope_theta`` (flat only)."""
    params = config.get("rope_parameters") or {}
    nested = bool(params) and all(isinstance(v, dict) or v is None for v in params.values())
    live = _live_config(config)
    out = {k: v for k, v in config.items() if k not in ("rope_scaling", "auto_map")}
    if nested:
        out["rope_parameters"] = {k: v and lower_parameters(v, live, k) for k, v in params.items()}
        return out
    out["rope_parameters"] = lower_parameters(dict(params) or {"rope_type": "default"}, live, None)
    return {**out, **legacy_keys(out["rope_parameters"])}


def lower_parameters(params: dict, config, layer_type: str | None) -> dict:
    """One flat rope_parameters dict in stock form (unchanged for transformers' own types)."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in BUILTIN_TYPES:
        return dict(params)
    method = get_method(rope_type)  # KeyError naming the known types for an unknown one
    if method.kind != "frequency" or method.dynamic:
        why = "attention-level" if method.kind != "frequency" else "dynamic (its frequencies depend on the length)"
        raise NotLowerable(f"rope_type={rope_type!r} is {why}: no stock transformers type is equivalent")
    setup = rope_setup(config, layer_type)
    kept = {k: params[k] for k in ("partial_rotary_factor",) if params.get(k) is not None}
    return {**LOWERINGS.get(rope_type, to_longrope)(params, setup, method, config, layer_type), **kept}


def to_default(params, setup, method, config, layer_type) -> dict:
    """ntk: the same base formula with b * s^(d/(d-2)), attention factor 1."""
    return {"rope_type": "default", "rope_theta": ntk_base(setup.base, float(params["factor"]), setup.dim)}


def to_yarn(params, setup, method, config, layer_type) -> dict:
    """ntk_by_parts: yarn's frequencies with the same betas, L0 and truncate, and attention factor 1."""
    return {
        "rope_type": "yarn",
        "rope_theta": setup.base,
        "factor": float(params["factor"]),
        "original_max_position_embeddings": setup.original_max,
        "attention_factor": 1.0,
        "beta_fast": float(params.get("beta_fast") or 32.0),
        "beta_slow": float(params.get("beta_slow") or 1.0),
        "truncate": params.get("truncate", True) is not False,
    }


def to_longrope(params, setup, method, config, layer_type) -> dict:
    """A static per-pair schedule: longrope with equal short and long factors theta_i / inv_freq_i."""
    inv_freq, attention_factor = method.frequencies(config, layer_type=layer_type)
    factors = longrope_factors(inv_freq, setup.base, setup.dim)
    return {
        "rope_type": "longrope",
        "rope_theta": setup.base,
        "short_factor": factors,
        "long_factor": factors,
        "factor": float(params.get("factor") or setup.max_position_embeddings / setup.original_max),
        "original_max_position_embeddings": setup.original_max,
        "attention_factor": float(attention_factor),
    }


LOWERINGS = {"ntk": to_default, "ntk_by_parts": to_yarn}


def longrope_factors(inv_freq, base: float, dim: int) -> list[float]:
    """fp32 factors f_i with 1 / (f_i * b^(2i/d)) == inv_freq_i as longrope computes it (nudged by one ulp if not)."""
    import torch

    with torch.autocast(device_type="cpu", enabled=False):
        powers = base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)  # [d/2], longrope's b^(2i/d)
        target = inv_freq.detach().float().cpu()
        first = (1.0 / (target.double() * powers.double())).float()
        candidates = torch.stack([first, first.nextafter(first * 2), first.nextafter(first * 0)])  # [3, d/2]
        exact = (1.0 / (candidates * powers)) == target  # [3, d/2]
        pick = torch.where(exact.any(0), exact.float().argmax(0), torch.zeros_like(target, dtype=torch.int64))
    return candidates.gather(0, pick[None])[0].tolist()


def legacy_keys(params: dict) -> dict:
    """For readers before transformers 5: ``rope_scaling`` (None for default) and top-level ``rope_theta``."""
    rope_type = params.get("rope_type", "default")
    legacy = {"rope_theta": params.get("rope_theta", 10000.0)}
    if params.get("partial_rotary_factor") is not None:
        legacy["partial_rotary_factor"] = params["partial_rotary_factor"]
    legacy["rope_scaling"] = None if rope_type == "default" else {**params, "type": rope_type}
    return legacy


# ---------------------------------------------------------------------------------------------------------------
# files


def read_model_config(src: Path) -> dict:
    """config.json of a saved model directory; a directory without one is no model."""
    if not src.is_dir():
        raise NotADirectoryError(f"src={str(src)!r} is not a directory")
    if (src / "adapter_config.json").is_file():
        raise ValueError(
            f"src={str(src)!r} is a peft adapter: export a saved (merged) model; push adapters as they are"
        )
    path = src / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"src={str(src)!r} is not a saved model: it has no config.json")
    check_folder(src)  # a damaged weight or tokenizer file is named now, not copied
    config = read_json(path)
    if "model_type" not in config:
        raise KeyError(f"{path} lacks 'model_type'; cannot tell which model it is")
    return config


def check_paths(src: Path, dst: Path) -> None:
    s, d = src.resolve(), dst.resolve()
    if d == s or s in d.parents or d in s.parents:
        raise ValueError(f"dst={str(dst)!r} must lie outside src={str(src)!r} (src is never written)")


def check_layout(config: dict) -> None:
    """Stock transformers runs a family's weights in its own layout only (the family's default: half for the
    rope-registry families); others need the package's load-time conversion."""
    family = find_family(config.get("model_type"))
    stock = family.default_layout if family is not None else "half"
    layout = config.get("rope_layout") or stock
    if layout != stock:
        raise NotLowerable(
            f"rope_layout={layout!r} in config.json: stock transformers only runs {stock!r} weights (convert first "
            f"with hf-rope-ext convert-layout SRC TMP --to {stock})"
        )


def copy_files(src: Path, dst: Path) -> None:
    """Every top-level file but config.json and README.md, unchanged (weights, tokenizer, generation config)."""
    files = [p for p in sorted(src.iterdir()) if p.is_file() and p.name not in SKIPPED_FILES]
    files = [p for p in files if not p.name.startswith(".")]  # hidden ones (a manifest of ours) stay behind
    for path in bar(files, desc="copying", unit="file", enabled=len(files) >= 4):
        shutil.copy2(path, dst / path.name)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_card(staging: Path, result: tuple, model_id: str, base_model, license, notes) -> None:
    mode, source, params, error = result
    extra = (
        f"Lowering checked against transformers' rotary module: max relative difference {error:.3g}."
        if error is not None
        else ""
    )
    write_model_card(
        staging,
        kind="export",
        model_id=model_id,
        base_model=base_model,
        rope_parameters=params,
        source_rope_parameters=source if mode != "stock" and source != params else None,
        license=license,
        notes="\n\n".join(n for n in (notes, extra) if n) or None,
    )


def _live_config(config: dict):
    """A transformers config object built from config.json as it stands (the package's types registered)."""
    from transformers import AutoConfig

    data = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(config["model_type"], **data)
