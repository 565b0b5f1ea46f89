"""Push a saved model or peft adapter directory to the Hugging Face Hub, with its model card.

:func:`upload_plan` decides exactly what goes up: what a reader needs and nothing else, i.e. the folder's top-level
files (weights or adapter, config, tokenizer, generation config, evaluation results, plots, report) without hidden
files or training state (optimizer, scheduler, RNG), and no subfolder: a fine-tuning run's ``checkpoints/`` and
``logs/`` stay local, and its ``merged/`` model is pushed on its own (``push RUN/merged``). The ``README.md`` is the
user's own unchanged, ours with its usage snippet pointed at the repo id, or a new card. A base model named by a
local path (``adapter_config.json``, or our card) is refused unless ``base_model_id`` gives its Hub id, which then
replaces the path in the uploaded ``adapter_config.json`` and card. ``push(..., dry_run=DIR)`` writes the plan to
``DIR`` and uploads nothing; otherwise the plan is one commit (``create_repo`` then ``create_commit``). The source
directory is only read, whatever happens.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..store.files import check_file, read_json
from ..store.outputs import MARKER, Staged, is_generated_card
from ..types.registry import BUILTIN_TYPES, get_method
from .cards import is_repo_id, write_model_card

# the first argument of the card's loading call, or the adapter path of the adapter snippet
SNIPPET_PATH = re.compile(r'(from_pretrained\(|^adapter = )"[^"]*"', re.MULTILINE)
BASE_LINE = re.compile(r"^Base model: `(.+)`\.$", re.MULTILINE)  # the templates' base model sentence
TRAINING_STATE = ("optimizer", "scheduler", "random_states", "rng_state", "trainer_state", "training_args", "scaler")
FOLDER_NOTES = {
    "checkpoints": "training state",
    "logs": "training logs",
    "merged": "the merged model: push RUN/merged to a repo of its own",
}


class HubError(RuntimeError):
    """The Hub could not be reached or refused the upload; nothing local was changed."""


@dataclass
class UploadPlan:
    """path in repo -> local file or content, and what of the folder stays local (with why)."""

    files: dict[str, Path | bytes]
    left_out: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        sizes = {n: (len(item) if isinstance(item, bytes) else item.stat().st_size) for n, item in self.files.items()}
        lines = [f"files to upload: {len(sizes)}, {sum(sizes.values()) / 1e6:.2f} MB"]
        lines += [f"  {name}  {size / 1e6:.3f} MB" for name, size in sizes.items()]
        return lines + [f"left out: {item}" for item in self.left_out]


def push(
    src,
    repo_id: str,
    *,
    private: bool = False,
    dry_run=None,
    overwrite: bool = False,
    token: str | None = None,
    base_model_id: str | None = None,
    commit_message: str = "Upload with hf-rope-ext",
    report: Callable[[str], None] | None = None,
) -> str:
    """Upload ``src`` to ``repo_id`` (or write what would be uploaded to ``dry_run``, an existing folder only with
    ``overwrite``); returns the URL or folder. ``report`` receives the file list before anything is written."""
    src = Path(src)
    stage = None if dry_run is None else dry_run_stage(Path(dry_run), src, overwrite)
    check_repo_id(repo_id, "--repo-id")
    if base_model_id is not None:
        check_repo_id(base_model_id, "--base-model-id")
    plan = upload_plan(src, repo_id, base_model_id)
    for line in plan.describe() if report else ():
        report(line)
    if stage is not None:
        return str(write_plan(plan.files, stage))
    return upload(plan.files, repo_id, private=private, token=resolve_token(token), commit_message=commit_message)


def check_repo_id(repo_id: str, flag: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"{flag} {repo_id!r} is not a valid Hub repo id ('name' or 'owner/name'): {err}") from None


def directory_kind(src: Path) -> str:
    """ "model" (config.json) or "adapter" (adapter_config.json); anything else is no model."""
    if not src.is_dir():
        raise NotADirectoryError(f"SRC {str(src)!r} is not a directory")
    if (src / "config.json").is_file():  # a model's, or the extended config an adapter was trained with
        check_rope_type(_json(src / "config.json"))
    if (src / "adapter_config.json").is_file():
        return "adapter"
    if (src / "config.json").is_file():
        return "model"
    raise FileNotFoundError(f"SRC {str(src)!r} is neither a saved model (config.json) nor a peft adapter")


def check_rope_type(config: dict) -> None:
    """Every rope_type in config.json must be transformers' own or this package's (KeyError otherwise)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    entries = [v for v in params.values() if isinstance(v, dict)] or [params]
    for entry in entries:
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type not in BUILTIN_TYPES:
            get_method(rope_type)


def upload_plan(src: Path, repo_id: str, base_model_id: str | None = None) -> UploadPlan:
    """What goes up (see the module docstring); ValueError for a base named by a local path without an id."""
    kind = directory_kind(src)
    files, left_out = reader_files(src)
    for path in files.values():  # what goes up must be readable: a damaged file is named before anything is written
        check_file(path)
    readme = src / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else None
    ours = text if text and MARKER in text else None
    local = local_base(src, kind, ours)
    if local is not None and base_model_id is None:
        raise ValueError(
            f"SRC {str(src)!r} names its base model by the local path {local!r}, which nobody else can load; pass "
            "--base-model-id OWNER/NAME (the base model's Hub repo id): it replaces the path in the uploaded "
            "adapter_config.json and card"
        )
    if kind == "adapter" and base_model_id is not None:
        config = {**_json(src / "adapter_config.json"), "base_model_name_or_path": base_model_id}
        files["adapter_config.json"] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
    if text is not None and ours is None and not is_generated_card(text):
        return UploadPlan(files, left_out)  # the user's own card goes up unchanged
    files["README.md"] = card_for_repo(src, kind, repo_id, ours, base_model_id, local)
    return UploadPlan(files, left_out)


def reader_files(src: Path) -> tuple[dict[str, Path], list[str]]:
    """The top-level files a reader needs; the subfolders and training-state files left out, each with why."""
    files, left_out = {}, []
    for path in sorted(src.iterdir()):
        if path.name.startswith(".") or path.name == "__pycache__":
            continue
        if path.is_dir():
            left_out.append(f"{path.name}/ ({FOLDER_NOTES.get(path.name, 'subfolder: only top-level files go up')})")
        elif path.name.startswith(TRAINING_STATE):
            left_out.append(f"{path.name} (training state)")
        elif path.is_file():
            files[path.name] = path
    return files, left_out


def local_base(src: Path, kind: str, ours: str | None) -> str | None:
    """The base model as named by adapter_config.json or our card, when that is no Hub repo id (a local path)."""
    names = [_json(src / "adapter_config.json").get("base_model_name_or_path")] if kind == "adapter" else []
    names += BASE_LINE.findall(ours or "")
    return next((name for name in names if name and not is_repo_id(name)), None)


def card_for_repo(
    src: Path, kind: str, repo_id: str, ours: str | None, base_model_id: str | None = None, local: str | None = None
) -> bytes:
    """Our card with its snippet loading ``repo_id`` (and the base's Hub id for a local path); a new card when
    there is none of ours."""
    if ours is not None:
        text = SNIPPET_PATH.sub(lambda m: f"{m.group(1)}{json.dumps(repo_id)}", ours)
        return (with_base_model(text, base_model_id, local) if base_model_id else text).encode("utf-8")

    with tempfile.TemporaryDirectory() as tmp:  # write_model_card writes README.md into a folder: not into src
        config = _json(src / "config.json")
        rope_parameters = config.get("rope_parameters") or {}
        base = _json(src / "adapter_config.json").get("base_model_name_or_path") if kind == "adapter" else None
        card_kind = "adapter" if kind == "adapter" else "extended"
        write_model_card(
            tmp,
            kind=card_kind,
            model_id=repo_id,
            base_model=base_model_id or base,
            rope_parameters=rope_parameters,
            rope_layout=config.get("rope_layout", "half"),
        )
        return (Path(tmp) / "README.md").read_bytes()


def with_base_model(text: str, base_model_id: str, local: str | None) -> str:
    """The card naming ``base_model_id``: in its metadata (``base_model``) and wherever it named the local path."""
    from huggingface_hub import ModelCard

    card = ModelCard(text, ignore_metadata_errors=True)
    card.data.base_model = base_model_id
    text = str(card)
    text = text.replace(local, base_model_id) if local else text
    return BASE_LINE.sub(lambda _: f"Base model: `{base_model_id}`.", text)


def dry_run_stage(folder: Path, src: Path, overwrite: bool):
    """The dry run's output folder, outside ``src``: new, empty, or with ``overwrite`` the files a dry run writes
    replaced (``outputs.Staged``: written beside it, renamed at the end)."""
    if src.resolve() in (folder.resolve(), *folder.resolve().parents):
        raise ValueError(f"--dry-run folder {str(folder)!r} must lie outside SRC {str(src)!r}")
    return Staged(folder, overwrite, "--dry-run")


def write_plan(plan: dict[str, Path | bytes], stage) -> Path:
    """The dry run: ``stage``'s folder holds exactly what would be uploaded."""
    with stage as folder:
        for name, item in plan.items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, target) if isinstance(item, Path) else target.write_bytes(item)
    return stage.target


def resolve_token(token: str | None) -> str:
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise ValueError(
            "no Hugging Face token: pass --token, set HF_TOKEN or run `hf auth login` (nothing was uploaded)"
        )
    return token


def upload(plan: dict[str, Path | bytes], repo_id: str, *, private: bool, token: str, commit_message: str) -> str:
    """One commit with every planned file; Hub and network failures become :class:`HubError`."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    operations = [CommitOperationAdd(path_in_repo=n, path_or_fileobj=item) for n, item in plan.items()]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        info = api.create_commit(repo_id, operations, commit_message=commit_message, repo_type="model")
    except Exception as err:  # the network boundary: every failure is reported, none is swallowed
        raise HubError(f"pushing to {repo_id!r} at {api.endpoint} failed: {type(err).__name__}: {err}") from err
    return info.commit_url


def _json(path: Path) -> dict:
    return read_json(path) if path.is_file() else {}
