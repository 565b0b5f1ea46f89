"""Evaluation documents: text files or a folder of them, the bundled evaluation split by default, as token ids."""

from __future__ import annotations

from pathlib import Path

import torch

from ..store import bundled
from . import python_docs

TEXT_SUFFIXES = (".txt", ".py", ".md", ".rst", ".json", ".jsonl", ".c", ".h", ".html", ".tex")


def resolve_files(data=None) -> list[Path]:
    """``data``: None (bundled eval split), a file, a folder (its text files, sorted), or a list of those."""
    if data is None:
        return bundled.corpus_files("eval")
    items = [data] if isinstance(data, (str, Path)) else list(data)
    files = []
    for item in map(Path, items):
        if item.is_dir():
            files += sorted(p for p in item.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"data: {str(item)!r} is neither a file nor a folder")
    if not files:
        raise ValueError(f"data: no text files ({', '.join(TEXT_SUFFIXES)}) under {[str(i) for i in items]}")
    return files


def encode(tokenizer, text: str) -> torch.Tensor:
    """Token ids of ``text`` (no special tokens), with the tokenizer's BOS in front when it has one; shape (n,)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return torch.tensor(bos + list(ids), dtype=torch.long)


def load_token_documents(tokenizer, data=None) -> list[torch.Tensor]:
    """Every document of ``data`` as a 1-D LongTensor of token ids, in file order (``python-docs``: the documents
    of :mod:`.python_docs`)."""
    texts = python_docs.texts() if python_docs.is_python_docs(data) else bundled.read_documents(resolve_files(data))
    return [encode(tokenizer, text) for text in texts]


def long_enough(documents: list[torch.Tensor], length: int, limit: int | None = None) -> list[torch.Tensor]:
    """The first ``limit`` documents with at least ``length`` tokens; ValueError when there is none."""
    keep = [doc for doc in documents if len(doc) >= length][:limit]
    if not keep:
        longest = max((len(doc) for doc in documents), default=0)
        raise ValueError(
            f"length={length}: no evaluation document has that many tokens (longest: {longest}); "
            f"pass shorter --lengths or longer --data"
        )
    return keep
