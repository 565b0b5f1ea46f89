"""Long real English documents that every CPython ships: the reference manual's topic pages.

``pydoc_data/topics.py`` holds the text ``help()`` shows for each language topic ("assert", "atom-identifiers",
...): about 470k characters of English prose with code, not part of the bundled corpus (which excludes
``pydoc_data``) nor of what ``finetune`` trains on by default. The pages, in key order and joined by blank lines,
are cut at paragraph boundaries into documents of at least ``DOCUMENT_CHARS`` characters (about 35k tokens each
for SmolLM2's tokenizer, enough for 32k-token windows): 3 documents from CPython 3.11, the same on every machine
with the same Python.
Selected with ``--data python-docs``.
"""

from __future__ import annotations

NAME = "python-docs"
DOCUMENT_CHARS = 140_000


def is_python_docs(data) -> bool:
    """Does ``data`` (a --data value: None, a string or a list of strings) name this source?"""
    items = list(data) if isinstance(data, (list, tuple)) else [data]
    return items == [NAME]


def texts(document_chars: int = DOCUMENT_CHARS) -> list[str]:
    """The topic pages as documents of at least ``document_chars`` characters, cut where a paragraph ends (the
    remainder joins the last document)."""
    from pydoc_data.topics import topics

    paragraphs = "\n\n".join(topics[key].strip() for key in sorted(topics)).split("\n\n")
    documents, current, size = [], [], 0
    for paragraph in paragraphs:
        current.append(paragraph)
        size += len(paragraph) + 2
        if size >= document_chars:
            documents.append("\n\n".join(current))
            current, size = [], 0
    if current:  # a short tail goes with the last document
        documents[-1:] = ["\n\n".join(documents[-1:] + current)]
    return documents
