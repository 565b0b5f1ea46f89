"""One spelling suggestion for a misspelled name (a rope type, a rope parameter, a command-line flag)."""

from __future__ import annotations

import difflib


def did_you_mean(word: str, choices) -> str:
    """``" (did you mean 'factor'?)"`` for the closest of ``choices``, or ``""`` when none is close."""
    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.7)
    return f" (did you mean {found[0]!r}?)" if found else ""


def typo_of(missing: str, given) -> str:
    """For a required name that is missing: ``" ('fator' was given: a misspelling?)"`` when one of ``given`` is close
    to it, else ``""``."""
    found = difflib.get_close_matches(missing, [str(g) for g in given], n=1, cutoff=0.7)
    return f" ({found[0]!r} was given: a misspelling?)" if found else ""
