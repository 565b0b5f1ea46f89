"""Reading the files of a model, an adapter or a training checkpoint: the one place that turns what the loaders raise
on a damaged file (safetensors, ``torch.load``, json) into an error naming the file and what to do.

:func:`check_folder` reads the top-level files of a folder the way their loaders will (every ``*.json`` parsed,
every ``*.safetensors`` header opened and its size checked, every ``torch.save`` archive's checksums read) before a
command loads anything or creates its output; :func:`reading` maps the same exceptions raised by a loader itself.
"""

from __future__ import annotations

import functools
import json
import pickle
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REMEDY = "the file is damaged or incomplete (an interrupted save, copy or download?): save, copy or download it again"
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
PICKLE_START = b"\x80"  # a plain pickle (torch.save's legacy format): not checked beyond being readable


class UnreadableFileError(ValueError):
    """A file that exists but cannot be read as what it should be."""


def load_errors() -> tuple[type[BaseException], ...]:
    """What json, safetensors and ``torch.load`` raise on a damaged file (RuntimeError: torch's zip reader)."""
    from safetensors import SafetensorError

    errors = (json.JSONDecodeError, UnicodeDecodeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile)
    return (*errors, SafetensorError, RuntimeError)


def unreadable(path, err: BaseException, remedy: str = REMEDY) -> UnreadableFileError:
    lines = str(err).strip().splitlines()
    reason = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return UnreadableFileError(f"cannot read {str(path)!r} ({reason}); {remedy}")


@contextmanager
def reading(path, remedy: str = REMEDY, also: tuple[type[BaseException], ...] = ()):
    """Around a loader of ``path`` (a file, or the folder whose files it reads): its load errors (and ``also``, what a
    particular parser raises) name ``path``."""
    try:
        yield
    except (*load_errors(), *also) as err:
        raise unreadable(path, err, remedy) from err


def read_json(path) -> Any:
    """The parsed JSON file ``path``; :class:`UnreadableFileError` naming it when it is not JSON."""
    with reading(path):
        return json.loads(Path(path).read_text(encoding="utf-8"))


def check_folder(folder) -> None:
    """Every top-level file of ``folder`` that a loader reads (json, safetensors, torch archives) is readable."""
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and not path.name.startswith("."):
            check_file(path)


def check_file(path) -> None:
    """One file is readable as its suffix says (other suffixes are not read)."""
    stat = Path(path).stat()
    _check_file(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _check_file(path: str, size: int, mtime_ns: int) -> None:
    """One file, by its suffix (checked once per size and modification time: commands load a model many times)."""
    suffix = Path(path).suffix
    if suffix == ".json":
        read_json(path)
    elif suffix == ".safetensors":
        check_safetensors(path)
    elif suffix in TORCH_SUFFIXES:
        check_torch_file(path)


def check_safetensors(path) -> None:
    """The header opens and the file is as long as the header says (safetensors checks both)."""
    from safetensors import safe_open

    with reading(path), safe_open(str(path), framework="pt") as handle:
        handle.keys()


def check_torch_file(path) -> None:
    """A ``torch.save`` zip archive whose every member's checksum matches; a legacy plain pickle passes."""
    with open(path, "rb") as handle:
        start = handle.read(1)
    if start == PICKLE_START:
        return
    with reading(path):
        if not zipfile.is_zipfile(path):
            raise zipfile.BadZipFile("not a torch.save archive (no zip directory: cut short?)")
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"member {bad!r} fails its checksum")
