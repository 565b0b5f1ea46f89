"""Where the commands write, and what ``--overwrite`` may replace. One rule for every command:

- a target that exists (a file, or a folder that is not empty) is refused without ``--overwrite``, before any work;
- with ``--overwrite`` only the files the command writes are replaced; every other file stays, and no folder is
  removed that the package did not create;
- a ``README.md`` that hf-rope-ext did not generate is never replaced: a command that writes a model card there
  refuses, naming the file.

Every command writes into a temporary sibling of its target and renames at the end, so a failure leaves the target
as it was and nothing beside it: a folder through :class:`Staged` (``extend``, ``export``, ``convert-layout``, ``push
--dry-run``, GGUF conversion; ``finetune`` keeps a run that can be resumed, see ``train.job``), single files
through :func:`write_files` (``eval --json/--plot/--needle``). A staged folder records what it wrote in
:data:`MANIFEST`, so that a later ``--overwrite`` removes the package's own stale files (the shards of a model now
written unsharded) and nothing else. What is moved into place gets the permissions of the user's umask (temporary
folders are made 0700 and safetensors writes its files 0600; a colleague on the same server must read them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

MARKER = "<!-- hf-rope-ext:generated"  # in every model card the package writes (``publish.cards``)

MANIFEST = ".hf-rope-ext-files.json"  # {"files": [...], "dirs": [...]}: relative paths the package wrote / made
CARD = "README.md"


def check_file(path, overwrite: bool, flag: str) -> None:
    """An output file: refused when it exists (unless ``overwrite``) or is a folder."""
    if path is None or not Path(path).exists():
        return
    if Path(path).is_dir():
        raise IsADirectoryError(f"{flag} {str(path)!r} is a folder; give a file name")
    if not overwrite:
        raise FileExistsError(f"{flag} {str(path)!r} exists; pass --overwrite to replace it")


def check_dir(path, overwrite: bool, flag: str, writes_card: bool = False) -> None:
    """An output folder: refused when it is a file, or not empty without ``overwrite``; a README.md the package did
    not write is refused when the command writes a card."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise NotADirectoryError(f"{flag} {str(path)!r} is a file; give a folder")
    if any(path.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{flag} {str(path)!r} exists and is not empty; pass --overwrite to replace the files this command "
            "writes (other files there are kept), or choose a new folder"
        )
    if writes_card and not card_is_ours(path / CARD):
        raise FileExistsError(
            f"{flag} {str(path)!r}: its {CARD} was not written by hf-rope-ext and is never replaced; move it away "
            "(the model card is written there)"
        )


def is_generated_card(text: str) -> bool:
    """Ours (carries MARKER) or huggingface_hub's empty default template as peft's save_pretrained leaves it."""
    from huggingface_hub import ModelCard, ModelCardData

    if MARKER in text:
        return True
    placeholder = ModelCard.from_template(ModelCardData()).text.strip()
    body = ModelCard(text, ignore_metadata_errors=True).text.split("### Framework versions")[0]
    return body.strip() == placeholder


def card_is_ours(path: Path) -> bool:
    """True when ``path`` is absent or a card hf-rope-ext (or peft's placeholder) wrote."""
    return not path.is_file() or is_generated_card(path.read_text(encoding="utf-8", errors="replace"))


class Staged:
    """``with Staged(dst, overwrite, "DST") as tmp:`` write into ``tmp``; on success the files move into ``dst``.

    After the block, ``written``, ``removed`` (the package's stale files) and ``kept`` (files it did not write)
    list relative paths."""

    def __init__(self, target, overwrite: bool, flag: str, writes_card: bool = False):
        check_dir(target, overwrite, flag, writes_card)
        self.target = Path(target)
        self.dir: Path | None = None
        self.written: list[str] = []
        self.removed: list[str] = []
        self.kept: list[str] = []

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.partial-", dir=self.target.parent))
        return self.dir

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.written, self.removed, self.kept = commit(self.dir, self.target)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def summary(self) -> list[str]:
        """Lines for the command's output: what was replaced around the user's files."""
        lines = []
        if self.removed:
            lines.append(f"removed {len(self.removed)} stale file(s) of an earlier run: {_names(self.removed)}")
        if self.kept:
            lines.append(f"kept {len(self.kept)} file(s) this command does not write: {_names(self.kept)}")
        return lines


def _names(items: list[str], most: int = 6) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def commit(staging: Path, target: Path) -> tuple[list[str], list[str], list[str]]:
    """Move every file of ``staging`` into ``target`` (replacing same-named files), remove the files the previous
    manifest lists that were not written again, record the new manifest; returns (written, removed, kept)."""
    written = relative_files(staging)
    made = sorted({p.parent.as_posix() for p in map(Path, written)} - {"."})
    if not target.exists():
        _write_manifest(staging, written, made)
        apply_umask(staging)
        staging.rename(target)
        staging.mkdir()  # the caller removes the (now empty) staging folder
        return written, [], []
    before = _read_manifest(target)
    created = {d for d in made if not (target / d).exists()}
    apply_umask(staging)
    for name in written:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, target / name)
    removed = [name for name in before["files"] if name not in written and (target / name).is_file()]
    for name in removed:
        (target / name).unlink()
    ours = created | {d for d in before["dirs"] if (target / d).is_dir()}
    for folder in sorted(ours, key=len, reverse=True):  # only the package's own folders, only when empty
        if not any((target / folder).iterdir()):
            (target / folder).rmdir()
    _write_manifest(target, written, sorted(d for d in ours if (target / d).is_dir()))
    kept = [name for name in relative_files(target) if name not in written]
    return written, removed, kept


def relative_files(folder: Path) -> list[str]:
    """Every file under ``folder`` as a relative POSIX path, the manifest excluded."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {"files": list(data.get("files", [])), "dirs": list(data.get("dirs", []))}


def _write_manifest(folder: Path, files: list[str], dirs: list[str]) -> None:
    (folder / MANIFEST).write_text(json.dumps({"files": files, "dirs": dirs}, indent=1) + "\n", encoding="utf-8")


def write_files(writers: dict) -> list[Path]:
    """``{path: write}``: each ``write(tmp)`` fills a temporary sibling of ``path`` (same suffix, so plots keep their
    format); once every one has succeeded they are renamed over their paths, else all are removed."""
    staged: dict[Path, Path] = {}
    try:
        for path, write in writers.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(prefix=f".{path.stem}.partial-", suffix=path.suffix, dir=path.parent)
            os.close(handle)
            staged[path] = Path(name)
            write(staged[path])
        for path, tmp in staged.items():
            apply_umask(tmp)
            os.replace(tmp, path)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    return list(staged)


def user_umask() -> int:
    """The process' umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path) -> None:
    """``path`` and, for a folder, everything under it: mode 0666 (files) / 0777 (folders) less the umask."""
    mask, path = user_umask(), Path(path)
    for item in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if not item.is_symlink():
            item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)
