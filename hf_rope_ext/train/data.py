"""Training text with ``datasets``: local files or folders (the bundled corpus by default) or a Hub dataset name,
tokenized once, then packed or chunked into rows of exactly ``length`` tokens for each stage.

- ``pack``: documents joined end to end (each followed by EOS), cut into consecutive rows; only the tail is lost.
- ``chunk``: each document cut on its own; its tail shorter than ``length`` is dropped (no row mixes documents).
"""

from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..eval import load_token_documents
from ..store.bundled import corpus_files
from .retrieval import mix_retrieval

if TYPE_CHECKING:
    from .config import FinetuneConfig
    from .loop import Stage

TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")  # what a folder contributes
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}  # others: plain text
PACKING = ("pack", "chunk")


def data_files(data: list[str] | None) -> list[str]:
    """Files to read: each path as given, folders expanded to their text files (sorted); None: bundled train split."""
    if not data:
        return [str(p) for p in corpus_files("train")]
    files: list[str] = []
    for item in data:
        path = Path(item)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
            if not found:
                raise FileNotFoundError(f"--data {item!r}: folder holds no text files ({', '.join(TEXT_SUFFIXES)})")
            files += found
        elif path.is_file():
            files.append(str(path))
        else:
            raise FileNotFoundError(f"--data {item!r}: no such file or folder")
    return files


def is_hub_name(data: list[str] | None) -> bool:
    """One name that is not a local path (e.g. 'owner/dataset'): read from the Hub."""
    return bool(data) and len(data) == 1 and not Path(data[0]).exists() and "/" in data[0].strip("/")


def load_documents(data: list[str] | None, text_column: str = "text", split: str = "train"):
    """A ``datasets.Dataset`` with one document per row in column ``text``."""
    from datasets import load_dataset

    if is_hub_name(data):
        try:
            dataset = load_dataset(data[0], split=split)
        except Exception as err:  # unreachable Hub or unknown name: say which
            raise FileNotFoundError(
                f"--data {data[0]!r}: not a local path and not loadable from the Hub ({err})"
            ) from err
    else:
        dataset = local_documents(data_files(data))
    if text_column not in dataset.column_names:
        raise KeyError(f"text_column={text_column!r} is not a column of the data; columns: {dataset.column_names}")
    dataset = dataset.select_columns([text_column])
    return dataset if text_column == "text" else dataset.rename_column(text_column, "text")


def local_documents(files: list[str]):
    """Local files as a ``Dataset``: plain text read directly, one document per file, in memory (no cache files, no
    download manager and its "Downloading data" bar); json/parquet/csv through datasets' builder of that kind,
    without its progress bars."""
    from datasets import Dataset, load_dataset
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    builder = _builder(files)
    if builder == "text":  # as load_dataset("text", sample_by="document"): each file's text, universal newlines
        return Dataset.from_dict({"text": [Path(f).read_text(encoding="utf-8") for f in files]})
    shown = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        return load_dataset(builder, data_files=files, split="train")
    finally:
        if shown:
            enable_progress_bar()


def _builder(files: list[str]) -> str:
    kinds = {BUILDERS.get(Path(f).suffix, "text") for f in files}
    if len(kinds) != 1:
        raise ValueError(f"--data mixes file kinds {sorted(kinds)}; give files of one kind (text, json, parquet, csv)")
    return kinds.pop()


def tokenize(dataset, tokenizer):
    """Column ``input_ids``: each document's tokens followed by EOS (when the tokenizer has one)."""
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]

    def encode(batch):
        ids = tokenizer(batch["text"], add_special_tokens=False, verbose=False)["input_ids"]
        return {"input_ids": [row + eos for row in ids]}

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenizing")


def pack(tokenized, length: int, mode: str = "pack"):
    """Rows of exactly ``length`` token ids (column ``input_ids``), by ``mode`` ('pack' or 'chunk')."""
    if mode not in PACKING:
        raise ValueError(f"packing={mode!r} is not allowed; expected one of {list(PACKING)}")
    if length < 2:
        raise ValueError(f"length={length} is too short to train on; expected >= 2 tokens")
    group = _pack_rows if mode == "pack" else _chunk_rows
    return tokenized.map(
        lambda batch: {"input_ids": group(batch["input_ids"], length)},
        batched=True,
        remove_columns=tokenized.column_names,
        desc=f"{mode}ing to {length} tokens",
    )


def _pack_rows(documents: list[list[int]], length: int) -> list[list[int]]:
    stream = np.fromiter(chain.from_iterable(documents), dtype=np.int64)  # all documents end to end
    usable = (stream.size // length) * length
    return stream[:usable].reshape(-1, length).tolist()  # (rows, length)


def _chunk_rows(documents: list[list[int]], length: int) -> list[list[int]]:
    return list(chain.from_iterable(_pack_rows([doc], length) for doc in documents))


def check_enough(rows: int, needed: int, length: int, tokenized) -> None:
    """Too little data for one optimizer step is an error before training starts (counts tokens only then)."""
    if rows < needed:
        tokens = sum(len(ids) for ids in tokenized["input_ids"])
        raise ValueError(
            f"data: {tokens} tokens make {rows} rows of {length} tokens, fewer than one step needs "
            f"({needed} = batch size x gradient accumulation x processes); give more text or a shorter --length"
        )


def packed_stages(tokenized, stages: list[Stage], mode: str, needed: int) -> list:
    """One packed dataset per stage (rows of the stage's window); too little text for one step is an error."""
    datasets = [pack(tokenized, stage.window, mode) for stage in stages]
    for stage, packed in zip(stages, datasets, strict=True):
        check_enough(len(packed), needed, stage.window, tokenized)
    return datasets


def with_retrieval(datasets: list, tokenizer, cfg: FinetuneConfig) -> list:
    """Each stage's rows with a share ``cfg.retrieval`` made retrieval rows (``retrieval``; a ``labels`` column on
    every row); the rows as they are when the share is 0."""
    if not cfg.retrieval:
        return datasets
    seeds = [cfg.seed * 1009 + index for index in range(len(datasets))]  # one stream per stage
    return [
        mix_retrieval(d, tokenizer, cfg.retrieval, cfg.retrieval_keys, s, cfg.retrieval_same_kind)
        for d, s in zip(datasets, seeds, strict=True)
    ]


def load_text(cfg: FinetuneConfig, tokenizer):
    """(tokenized training text, evaluation documents as token id tensors or None when no --eval-lengths)."""
    train_text = tokenize(load_documents(cfg.data, cfg.text_column), tokenizer)
    if not cfg.eval_lengths:
        return train_text, None
    # held-out text: --eval-data, else the bundled eval split when training on the bundled corpus, else --data
    source = cfg.eval_data or (None if cfg.data is None else cfg.data)
    return train_text, load_token_documents(tokenizer, source)
