"""Where a model comes from: a local folder (or a GGUF file), or a Hub repo id; its config read in one line or refused
in one line naming it. A name that looks like a path is never looked up on the Hub, and a repo id that is not in the
Hub cache fails at once when the Hub cannot be reached (no retries: huggingface_hub would back off for ~25 s).
"""

from __future__ import annotations

from pathlib import Path

from . import from_gguf
from .files import check_folder

PROBE_TIMEOUT_S = 5.0


def check_model_path(path) -> Path:
    """A local model folder (with a readable config.json and weights), or a GGUF file, converted once to a folder
    (``from_gguf``); FileNotFoundError naming what is missing, UnreadableFileError naming a damaged file."""
    path = Path(path)
    if from_gguf.is_gguf(path):
        return from_gguf.model_folder(path)
    if not path.exists():
        raise FileNotFoundError(f"model {str(path)!r} is not a model directory (no such folder)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model {str(path)!r} is not a model directory (no config.json there)")
    check_folder(path)
    return path


def looks_like_path(name: str) -> bool:
    return Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def resolve_model(name: str) -> str:
    """A local model folder, or a Hub repo id: checked like :func:`check_model_path` when it exists here or looks
    like a path, so that a mistyped folder is never looked up on the Hub."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if looks_like_path(name):
        return str(check_model_path(Path(name).expanduser()))
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise FileNotFoundError(
            f"model {name!r} is not a model directory (no such folder) nor a Hub repo id ('name' or 'owner/name')"
        ) from None
    return name


def read_config(source):
    """The config of ``source``: a config object (returned as it is), a model folder, or a Hub repo id."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source
    name = resolve_model(str(source))
    return AutoConfig.from_pretrained(name) if Path(name).is_dir() else hub_config(name)


def hub_config(name: str):
    """The config of Hub repo ``name``: from the Hub cache when it is there, else from the Hub if it answers at once;
    one FileNotFoundError naming the repo id otherwise."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except OSError:
        pass
    why = hub_unreachable()
    if why is None:
        try:
            return AutoConfig.from_pretrained(name)
        except OSError as err:
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
    raise FileNotFoundError(
        f"model {name!r} is not a model directory (no such folder) nor a model on the Hub that could be read: {why}"
    )


def hub_unreachable() -> str | None:
    """None when the Hub answers a single request, else why not (offline mode, no network)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set and the repo is not in the Hub cache"
    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as err:  # the network boundary: any failure means "cannot be reached now"
        return f"the Hub ({constants.ENDPOINT}) cannot be reached: {type(err).__name__}: {err}"
    return None
