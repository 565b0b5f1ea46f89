"""Model cards (``README.md``) for extended models, LoRA adapters and portable exports.

The card is rendered by huggingface_hub's ``ModelCard.from_template`` from a Jinja template in ``model_cards/`` beside
this module (package data): YAML metadata (``ModelCardData``), the rope parameters and layout, the evaluation table
and plot, the training hyperparameters and a usage snippet that loads the folder as written. A ``README.md`` the user
wrote is never replaced: only a card carrying :data:`MARKER` (one this module generated) is, unless
``overwrite=True``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..layout.card_line import LAYOUT_TEXT, relabel_layout  # noqa: F401  (relabel_layout: public here too)
from ..store.files import read_json
from ..store.outputs import is_generated_card
from ..types.registry import available_rope_types

KINDS = {"extended": "transformers", "adapter": "peft", "export": "transformers"}  # kind -> library_name
RESULT_KEYS = ("rope_type", "factor", "length", "perplexity")
OPTIONAL_KEYS = ("passkey_accuracy", "far_context_ratio")
BASE_TAGS = ("hf-rope-ext", "rope", "long-context")


def templates_dir() -> Path:
    """``hf_rope_ext/publish/model_cards/``: one Jinja template per kind (``<kind>.md``), package data. Read when a
    card is written, not at import: the copy of the package that ``--remote-code`` exports vendor has no files."""
    return Path(__file__).resolve().parent / "model_cards"


def write_model_card(
    directory,
    *,
    kind: str,
    base_model: str | None = None,
    rope_parameters: dict | None = None,
    rope_layout: str = "half",
    results: list[dict] | None = None,
    plot=None,
    training: dict | None = None,
    license: str | None = None,
    tags: list[str] | None = None,
    notes: str | None = None,
    model_id: str | None = None,
    source_rope_parameters: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``directory/README.md`` for a model (``kind`` "extended" or "export") or a peft adapter ("adapter").

    ``rope_parameters`` default to those in ``directory/config.json``; ``model_id`` (what the snippet loads)
    defaults to the folder's absolute path; ``plot`` must be a file inside ``directory``.
    """
    from huggingface_hub import ModelCard

    directory = _existing_dir(directory)
    _check_choice("kind", kind, sorted(KINDS))
    _check_choice("rope_layout", rope_layout, sorted(LAYOUT_TEXT))
    target = directory / "README.md"
    refuse_user_readme(target, overwrite)
    params = dict(rope_parameters) if rope_parameters is not None else _config_rope_parameters(directory)
    model_id = model_id or str(directory.resolve())
    context = {
        "title": f"{model_id.rstrip('/').split('/')[-1]}: {params.get('rope_type', 'default')} RoPE",
        "base_model_text": f"`{base_model}`" if base_model else "",
        "rope_type": params.get("rope_type", "default"),
        "package_type": params.get("rope_type") in available_rope_types(),
        "rope_table": key_value_table(params, ("parameter", "value")),
        "source_rope_table": key_value_table(source_rope_parameters, ("parameter", "value")),
        "rope_layout": rope_layout,
        "layout_text": LAYOUT_TEXT[rope_layout],
        "results_table": results_table(results),
        "plot": _plot_path(directory, plot),
        "training_table": key_value_table(training, ("hyperparameter", "value")),
        "notes": notes or "",
        "remote_code": _has_auto_map(directory),
        "snippet": usage_snippet(
            kind, model_id, params, rope_layout, _has_auto_map(directory), (Path(directory) / "config.json").is_file()
        ),
    }
    data = card_data(kind, base_model, params, license, tags)
    card = ModelCard.from_template(data, template_path=str(templates_dir() / f"{kind}.md"), **context)
    target.write_text(str(card), encoding="utf-8")
    return target


# ---------------------------------------------------------------------------------------------------------------
# pieces


def card_data(kind: str, base_model: str | None, params: dict, license: str | None, tags: list[str] | None):
    """The YAML metadata; ``base_model`` goes there only when it is a Hub repo id (a local path is not)."""
    from huggingface_hub import ModelCardData

    rope_type = params.get("rope_type", "default")
    all_tags = list(dict.fromkeys([*BASE_TAGS, f"rope-{rope_type}".replace("_", "-"), *(tags or [])]))
    if kind == "adapter":
        all_tags.append("lora")
    return ModelCardData(
        base_model=base_model if is_repo_id(base_model) else None,
        library_name=KINDS[kind],
        license=license,
        tags=all_tags,
        pipeline_tag="text-generation",
    )


def is_repo_id(name: str | None) -> bool:
    """True for ``owner/name`` or ``name`` accepted by huggingface_hub that is not an existing local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def usage_snippet(
    kind: str, model_id: str, params: dict, rope_layout: str, remote_code: bool, has_config: bool = False
) -> str:
    """Python that loads the folder (or repo) exactly as written."""
    if kind == "adapter" and has_config:  # the extended base config (rope parameters, max length) sits beside it
        return (
            "import hf_rope_ext  # registers the rope types into transformers\n"
            "from peft import PeftConfig, PeftModelForCausalLM\n"
            "from transformers import AutoConfig, AutoModelForCausalLM\n\n"
            f"adapter = {json.dumps(model_id)}\n"
            "base = PeftConfig.from_pretrained(adapter).base_model_name_or_path\n"
            "config = AutoConfig.from_pretrained(adapter)  # the extended base config saved beside the adapter\n"
            "base_model = AutoModelForCausalLM.from_pretrained(base, config=config)\n"
            "model = PeftModelForCausalLM.from_pretrained(base_model, adapter)"
        )
    if kind == "adapter":
        extra = f", rope_parameters={params!r}" if params else ""
        extra += f", rope_layout={rope_layout!r}" if rope_layout != "half" else ""
        return (
            "import hf_rope_ext  # registers the rope types into transformers\n"
            "from peft import AutoPeftModelForCausalLM\n\n"
            f"model = AutoPeftModelForCausalLM.from_pretrained({json.dumps(model_id)}{extra})"
        )
    head = "" if kind == "export" else "import hf_rope_ext  # registers the rope types into transformers\n"
    trust = ", trust_remote_code=True" if remote_code else ""
    load = f"model = AutoModelForCausalLM.from_pretrained({json.dumps(model_id)}{trust})"
    return f"{head}from transformers import AutoModelForCausalLM\n\n{load}"


def key_value_table(values: dict | None, header: tuple[str, str]) -> str:
    """A two-column Markdown table; empty string for no values."""
    if not values:
        return ""
    rows = [f"| `{key}` | {_cell(value)} |" for key, value in values.items()]
    return "\n".join([f"| {header[0]} | {header[1]} |", "| --- | --- |", *rows])


def results_table(results: list[dict] | None) -> str:
    """Evaluation records -> Markdown; each needs rope_type, factor, length, perplexity (OPTIONAL_KEYS shown where any
    record has them)."""
    if not results:
        return ""
    for i, record in enumerate(results):
        missing = [key for key in RESULT_KEYS if key not in record]
        if missing:
            raise KeyError(f"results[{i}] lacks {missing[0]!r} (record {record!r}); required keys: {list(RESULT_KEYS)}")
    columns = list(RESULT_KEYS) + [key for key in OPTIONAL_KEYS if any(key in r for r in results)]
    rows = ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in results]
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns), *rows])


def refuse_user_readme(target: Path, overwrite: bool) -> None:
    """A README.md the user wrote is never replaced without ``overwrite``; ours and untouched placeholders are."""
    if (
        target.exists()
        and not overwrite
        and not is_generated_card(target.read_text(encoding="utf-8", errors="replace"))
    ):
        raise FileExistsError(
            f"{target} exists and was not written by hf-rope-ext; refusing to replace it (move it away first)"
        )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"{len(value)} values: {_cell(value[0])} ... {_cell(value[-1])}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _plot_path(directory: Path, plot) -> str:
    if plot is None:
        return ""
    path = Path(plot) if Path(plot).is_absolute() else directory / plot
    resolved = path.resolve()
    if not resolved.is_file() or directory.resolve() not in resolved.parents:
        raise ValueError(f"plot={str(plot)!r} must be an existing image file inside {str(directory)!r}")
    return resolved.relative_to(directory.resolve()).as_posix()


def _existing_dir(directory) -> Path:
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"directory={str(directory)!r} is not an existing directory")
    return directory


def _check_choice(key: str, value: Any, allowed: list[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not allowed; expected one of {allowed}")


def _read_config(directory: Path) -> dict:
    path = directory / "config.json"
    return read_json(path) if path.is_file() else {}


def _config_rope_parameters(directory: Path) -> dict:
    return dict(_read_config(directory).get("rope_parameters") or {})


def _has_auto_map(directory: Path) -> bool:
    return bool(_read_config(directory).get("auto_map"))
