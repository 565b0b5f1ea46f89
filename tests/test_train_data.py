"""Text loading with datasets, tokenizing and packing/chunking, against slow references."""

import pytest
from datasets import Dataset
from transformers import ByT5Tokenizer

from hf_rope_ext.train.data import check_enough, data_files, load_documents, pack, tokenize

DOCS = [
    "def f(x):\n    return x + 1\n",
    "class A:\n    pass\n" * 7,
    "import os\n",
    "z = [i * i for i in range(9)]\n" * 3,
]


def pack_reference(docs_ids, length):
    stream = [t for doc in docs_ids for t in doc]
    return [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]


def chunk_reference(docs_ids, length):
    return [doc[i : i + length] for doc in docs_ids for i in range(0, len(doc) - length + 1, length)]


@pytest.fixture(scope="module")
def tokenized():
    return tokenize(Dataset.from_dict({"text": DOCS}), ByT5Tokenizer())


def test_tokenize_appends_eos(tokenized):
    tok = ByT5Tokenizer()
    for text, ids in zip(DOCS, tokenized["input_ids"], strict=True):
        assert ids == tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


@pytest.mark.parametrize("length", [2, 7, 16, 50])
@pytest.mark.parametrize("mode,reference", [("pack", pack_reference), ("chunk", chunk_reference)])
def test_pack_and_chunk_match_reference(tokenized, length, mode, reference):
    rows = pack(tokenized, length, mode)["input_ids"]
    assert rows == reference(tokenized["input_ids"], length)
    assert all(len(r) == length for r in rows)


def test_load_documents_from_files_and_folders(tmp_path):
    (tmp_path / "sub").mkdir()
    for i, text in enumerate(DOCS):
        (tmp_path / ("sub" if i % 2 else ".") / f"doc{i}.txt").write_text(text)
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    files = data_files([str(tmp_path)])
    assert [f.rsplit("/", 1)[-1] for f in files] == ["doc0.txt", "doc2.txt", "doc1.txt", "doc3.txt"]
    dataset = load_documents([str(tmp_path)])
    assert dataset.column_names == ["text"] and sorted(dataset["text"]) == sorted(DOCS)


def test_load_documents_jsonl_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"body": {text!r}, "n": 1}}\n'.replace("'", '"') for text in ["a b", "c d"]))
    assert load_documents([str(path)], text_column="body")["text"] == ["a b", "c d"]
    with pytest.raises(KeyError, match="text_column='text'"):
        load_documents([str(path)])


def test_bad_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        data_files([str(tmp_path / "missing.txt")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no text files"):
        data_files([str(tmp_path / "empty")])
    with pytest.raises(ValueError, match="packing='zip'"):
        pack(Dataset.from_dict({"input_ids": [[1, 2, 3]]}), 2, "zip")
    with pytest.raises(ValueError, match="70 tokens make 1 rows of 64 tokens, fewer than one step needs"):
        check_enough(rows=1, needed=2, length=64, tokenized=Dataset.from_dict({"input_ids": [[1] * 70]}))


def test_bundled_default_split():
    files = data_files(None)
    assert files and all(f.endswith(".py") for f in files)


def test_local_text_is_read_as_datasets_text_builder_reads_it_without_download_output(tmp_path, capfd):
    """Plain text files become one document each, as load_dataset('text', sample_by='document') makes them (CRLF
    and non-ASCII included), read directly: no download manager, no "Downloading data" bar, no cache files."""
    from datasets import load_dataset

    texts = ["déjà vu\r\nline two\r\n", "", "tab\tend", *DOCS]
    files = []
    for i, text in enumerate(texts):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_bytes(text.encode("utf-8"))
    capfd.readouterr()
    ours = load_documents([str(f) for f in files])
    printed = capfd.readouterr()
    assert "Downloading" not in printed.err + printed.out and "Generating" not in printed.err + printed.out
    assert ours.cache_files == []  # in memory: processes of one launch never write the same cache file
    reference = load_dataset("text", data_files=[str(f) for f in files], sample_by="document", split="train")
    assert ours["text"] == reference["text"]


def test_structured_files_load_without_progress_output(tmp_path, capfd):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a b"}\n{"text": "c d"}\n')
    capfd.readouterr()
    assert load_documents([str(path)])["text"] == ["a b", "c d"]
    printed = capfd.readouterr()
    assert "Downloading" not in printed.err and "Generating" not in printed.err
