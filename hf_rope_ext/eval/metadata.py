"""What a report records about its run, so that any figure can be traced back to what produced it: the versions of
the package, transformers, torch, peft and Python, the command as typed, the model (its path and a hash of its
config and weights), the adapter, the evaluation data, the date (UTC) and the run's ``provenance``: the package's
git commit and whether its tracked files were as committed ("unknown" outside a checkout, e.g. an installed wheel),
the dtype, the device and torch's thread count."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import time
from importlib import metadata as distributions
from pathlib import Path

HASHED_SUFFIXES = (".safetensors", ".bin", ".gguf")  # and config.json: what decides the model's outputs
PACKAGES = ("hf-rope-ext", "transformers", "torch", "peft", "accelerate")


def run_metadata(model, command: str, adapter=None, data=None, dtype=None, device=None, exclude=()) -> dict:
    """The record of a run (the module's docstring); ``exclude``: files the run writes into the checkout, whose
    changes do not make its tree unclean."""
    return {
        "command": command,
        "model": str(model),
        "model_sha256": folder_hash(model),
        "adapter": None if adapter is None else str(adapter),
        "adapter_sha256": None if adapter is None else folder_hash(adapter),
        "data": "the bundled evaluation split" if data is None else [str(d) for d in data],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {**{name: version(name) for name in PACKAGES}, "python": platform.python_version()},
        "provenance": provenance(dtype, device, exclude),
    }


def provenance(dtype=None, device=None, exclude=()) -> dict:
    """What a figure needs beside the versions: ``commit`` and ``clean`` (the checkout's tracked files, but the
    paths of ``exclude``, as committed), ``dtype``, ``device`` and ``threads`` (torch's intra-op threads)."""
    import torch

    commit, clean = checkout_state(exclude)
    dtype = None if dtype is None else str(dtype).removeprefix("torch.")
    return {"commit": commit, "clean": clean, "dtype": dtype, "device": None if device is None else str(device),
            "threads": torch.get_num_threads()}  # fmt: skip


def version(name: str) -> str | None:
    if name == "torch":  # the build too (+cpu, +cu128): PyPI's CUDA wheels leave it out of the distribution's version
        import torch

        return str(torch.__version__)
    try:
        return distributions.version(name)
    except distributions.PackageNotFoundError:
        return None


def folder_hash(folder) -> str | None:
    """sha256 over the names and contents of a model folder's config.json and weight files, in name order (None
    for a Hub id or a folder without them)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and (p.suffix in HASHED_SUFFIXES or p.name == "config.json")
    )
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(8 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def checkout_state(exclude=()) -> tuple[str, bool | str]:
    """(commit, clean) of the git checkout the package runs from, or ("unknown", "unknown") where it does not run
    from one (an installed wheel, also one inside another project's checkout) or git cannot tell. ``exclude``: paths
    whose changes do not count (a log the run appends to)."""
    here = Path(__file__).resolve()
    git = lambda *a: subprocess.run(["git", "-C", str(here.parent), *a], capture_output=True, text=True, timeout=60)  # noqa: E731
    try:
        top = git("rev-parse", "--show-toplevel")
    except (OSError, subprocess.SubprocessError):  # no git on the machine
        return "unknown", "unknown"
    if top.returncode or (Path(top.stdout.strip()) / "hf_rope_ext" / "eval" / here.name).resolve() != here:
        return "unknown", "unknown"
    head = git("rev-parse", "HEAD")
    skip = [f":(exclude){Path(p).resolve()}" for p in exclude]
    status = git("status", "--porcelain", "--untracked-files=no", "--", top.stdout.strip(), *skip)
    if head.returncode or status.returncode:
        return "unknown", "unknown"
    return head.stdout.strip(), status.stdout.strip() == ""
