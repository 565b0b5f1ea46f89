"""The bundled default model (a tiny Llama pretrained on the Python standard library) and its corpus.

The corpus is the ``.py`` source of the running interpreter's standard library. ``corpus_files.txt`` fixes the file
list (one ``split<TAB>relative/path.py`` line per file, sorted by path) so every machine reads the same documents;
the split is by file, decided by a hash of the relative path (:func:`split_of`).
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parent
MODEL_NAME = "tiny-llama-stdlib"
FILE_LIST = BUNDLED_DIR / "corpus_files.txt"
SPLITS = ("train", "eval")
EVAL_BUCKETS = 10  # one file in EVAL_BUCKETS (by path hash) goes to the evaluation split


def default_model_path() -> Path:
    """Directory of the shipped model (config.json, model.safetensors, tokenizer files, README.md)."""
    path = BUNDLED_DIR / MODEL_NAME
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"bundled model not found at {path}: run experiments/pretrain_tiny_llama.py (in a checkout) to build it"
        )
    return path


def stdlib_root() -> Path:
    """Root of the running interpreter's standard library (where the corpus files are read from)."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> str:
    """'eval' for about one file in ``EVAL_BUCKETS`` (stable across machines: sha1 of the path), else 'train'."""
    digest = hashlib.sha1(relative_path.encode("utf-8")).digest()
    return "eval" if digest[0] % EVAL_BUCKETS == 0 else "train"


def corpus_files(split: str = "eval", root: Path | None = None) -> list[Path]:
    """Absolute paths of the corpus files of ``split`` ('train' or 'eval'), in the fixed list's order.

    Raises FileNotFoundError naming the first listed file missing from this interpreter's stdlib.
    """
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}, allowed {list(SPLITS)}")
    root = Path(root) if root is not None else stdlib_root()
    rows = [line.split("\t", 1) for line in FILE_LIST.read_text(encoding="utf-8").splitlines() if line]
    files = [root / rel for name, rel in rows if name == split]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"corpus file {missing[0]} (and {len(missing) - 1} more) not found: the file list was made from the "
            f"Python 3.11 standard library; pass your own --data files instead"
        )
    return files


def read_documents(files: list[Path]) -> list[str]:
    """UTF-8 text of each file (undecodable bytes replaced), in order."""
    return [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]
