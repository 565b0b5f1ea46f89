"""Push a saved model or peft adapter directory to the Hugging Face Hub, with its model card.

:func:`upload_plan` decides exactly what goes up: every file of the directory (hidden ones excepted) and a
``README.md``: the user's own unchanged, ours with its usage snippet pointed at the repo id, or a new card.
``push(..., dry_run=DIR)`` writes that plan to ``DIR`` and uploads nothing; otherwise the plan is one commit
(``create_repo`` then ``create_commit``). The source directory is only read, whatever happens.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from .cards import MARKER, write_model_card
from .registry import BUILTIN_TYPES, get_method

SNIPPET_PATH = re.compile(r'(from_pretrained\()"[^"]*"')  # the first argument of the card's loading call


class HubError(RuntimeError):
    """The Hub could not be reached or refused the upload; nothing local was changed."""


def push(
    src,
    repo_id: str,
    *,
    private: bool = False,
    dry_run=None,
    token: str | None = None,
    commit_message: str = "Upload with hf-rope-ext",
) -> str:
    """Upload ``src`` to ``repo_id`` (or write what would be uploaded to ``dry_run``); returns the URL or folder."""
    src = Path(src)
    check_repo_id(repo_id)
    plan = upload_plan(src, repo_id)
    if dry_run is not None:
        return str(write_plan(plan, Path(dry_run), src))
    return upload(plan, repo_id, private=private, token=resolve_token(token), commit_message=commit_message)


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"repo_id={repo_id!r} is not a valid Hub repo id ('name' or 'owner/name'): {err}") from None


def directory_kind(src: Path) -> str:
    """ "model" (config.json) or "adapter" (adapter_config.json); anything else is no model."""
    if not src.is_dir():
        raise NotADirectoryError(f"src={str(src)!r} is not a directory")
    if (src / "config.json").is_file():  # a model's, or the extended config an adapter was trained with
        check_rope_type(_json(src / "config.json"))
    if (src / "adapter_config.json").is_file():
        return "adapter"
    if (src / "config.json").is_file():
        return "model"
    raise FileNotFoundError(f"src={str(src)!r} is neither a saved model (config.json) nor a peft adapter")


def check_rope_type(config: dict) -> None:
    """Every rope_type in config.json must be transformers' own or this package's (KeyError otherwise)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    entries = [v for v in params.values() if isinstance(v, dict)] or [params]
    for entry in entries:
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type not in BUILTIN_TYPES:
            get_method(rope_type)


def upload_plan(src: Path, repo_id: str) -> dict[str, Path | bytes]:
    """path in repo -> local file or content: the directory's files and the card to upload with them."""
    kind = directory_kind(src)
    files = {p.relative_to(src).as_posix(): p for p in sorted(src.rglob("*")) if p.is_file() and not _hidden(p, src)}
    readme = src / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else None
    if text is not None and MARKER not in text and not _is_placeholder(text):
        return files  # the user's own card goes up unchanged
    files["README.md"] = card_for_repo(src, kind, repo_id, text if text and MARKER in text else None)
    return files


def card_for_repo(src: Path, kind: str, repo_id: str, ours: str | None) -> bytes:
    """Our card with its snippet loading ``repo_id``; a new card when there is none of ours."""
    if ours is not None:
        return SNIPPET_PATH.sub(lambda m: f"{m.group(1)}{json.dumps(repo_id)}", ours).encode("utf-8")

    with tempfile.TemporaryDirectory() as tmp:  # write_model_card writes README.md into a folder: not into src
        config = _json(src / "config.json")
        rope_parameters = config.get("rope_parameters") or {}
        base = _json(src / "adapter_config.json").get("base_model_name_or_path") if kind == "adapter" else None
        card_kind = "adapter" if kind == "adapter" else "extended"
        write_model_card(
            tmp,
            kind=card_kind,
            model_id=repo_id,
            base_model=base,
            rope_parameters=rope_parameters,
            rope_layout=config.get("rope_layout", "half"),
        )
        return (Path(tmp) / "README.md").read_bytes()


def write_plan(plan: dict[str, Path | bytes], folder: Path, src: Path) -> Path:
    """The dry run: ``folder`` (new, outside ``src``) holds exactly what would be uploaded."""
    if folder.exists():
        raise FileExistsError(f"--dry-run folder {str(folder)!r} exists; give a new path")
    if src.resolve() in (folder.resolve(), *folder.resolve().parents):
        raise ValueError(f"--dry-run folder {str(folder)!r} must lie outside src={str(src)!r}")
    for name, item in plan.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item, target) if isinstance(item, Path) else target.write_bytes(item)
    return folder


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


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(root).parts)


def _is_placeholder(text: str) -> bool:
    from .cards import is_generated_card

    return is_generated_card(text)


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
