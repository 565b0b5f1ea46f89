"""The RULER tasks of lm-evaluation-harness (the ``ruler`` group of lm-eval 0.4.x): which build their data on this
machine and which need the network, names checked before any work, and the guard around lm-eval's import-time
``nltk.download``.

Where each task's data comes from (lm-eval 0.4.13, ``lm_eval/tasks/ruler/``; ``tests/test_ruler.py`` reads the
builders' source to keep this table true):

- made locally: ``niah_single_1`` (a repeated-sentence haystack), ``niah_multikey_2`` and ``niah_multikey_3`` (a
  haystack of other needles), ``ruler_vt`` (variable tracking), ``ruler_cwe`` and ``ruler_fwe`` (common and frequent
  word extraction; wonderwords' word lists and numpy);
- the network: the other needle tasks read Paul Graham's essays from the Hugging Face Hub
  (``baber/paul_graham_essays``) and split them with nltk's ``punkt_tab`` (downloaded from GitHub);
  ``ruler_qa_squad`` and ``ruler_qa_hotpot`` download SQuAD and HotpotQA.
"""

from __future__ import annotations

import contextlib
import io
import sys

from ..util.did_you_mean import did_you_mean

OFFLINE = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
ESSAY = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery", "niah_multivalue")
QA = ("ruler_qa_squad", "ruler_qa_hotpot")
TASKS = OFFLINE + ESSAY + QA  # every task of lm-eval's `ruler` group
DEFAULT = OFFLINE
ALIASES = {"vt": "ruler_vt", "cwe": "ruler_cwe", "fwe": "ruler_fwe", "qa_squad": "ruler_qa_squad"}
ALIASES["qa_hotpot"] = "ruler_qa_hotpot"
ESSAYS = "Paul Graham's essays from the Hugging Face Hub (baber/paul_graham_essays) and nltk's punkt_tab"
NETWORK = {
    **dict.fromkeys(ESSAY, ESSAYS),
    "ruler_qa_squad": "SQuAD v2 (downloaded from rajpurkar.github.io)",
    "ruler_qa_hotpot": "HotpotQA (downloaded from its site)",
}


def resolve(names, flag: str = "--ruler") -> list[str]:
    """Task names as lm-eval spells them, in order, once each; ``default`` (or an empty list) is :data:`DEFAULT`,
    ``all`` every task; an unknown name is refused with a did-you-mean and the allowed names."""
    chosen: list[str] = []
    for name in names or ["default"]:
        key = str(name).strip()
        found = {"default": list(DEFAULT), "all": list(TASKS)}.get(key)
        if found is None and ALIASES.get(key, key) in TASKS:
            found = [ALIASES.get(key, key)]
        if found is None:
            allowed = ", ".join((*TASKS, "default", "all"))
            raise ValueError(
                f"{flag} {key!r}: not a RULER task of lm-eval{did_you_mean(key, (*TASKS, *ALIASES))}; allowed: "
                f"{allowed}"
            )
        chosen += [t for t in found if t not in chosen]
    return chosen


def network_notes(tasks) -> list[str]:
    """One line per chosen task whose data needs the network (printed before any work)."""
    return [f"{t}: its data needs the network ({NETWORK[t]}); offline it fails" for t in tasks if t in NETWORK]


def needs_punkt(tasks) -> bool:
    """Whether any task splits essays into sentences (the only use of nltk's punkt_tab in lm-eval's RULER)."""
    return any(t in ESSAY for t in tasks)


class MissingExtra(ImportError, ValueError):
    """The [eval] extra is not installed (a ValueError too, so that the command says it in one line)."""


def require_lm_eval() -> None:
    """lm-eval with its RULER dependencies, or a MissingExtra (an ImportError) saying how to install them."""
    missing = []
    for module in ("lm_eval", "nltk", "wonderwords"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingExtra(
            f"RULER needs lm-eval with its 'ruler' extra ({', '.join(missing)} not installed): "
            "pip install 'hf-rope-ext[eval]' (or: pip install 'lm-eval[ruler]')"
        )


@contextlib.contextmanager
def nltk_guard(punkt_needed: bool, timeout: float = 20.0):
    """lm-eval's ``prepare_niah`` calls ``nltk.download("punkt_tab")`` when it is imported, whatever the task. Inside
    this context a download is skipped when no chosen task needs punkt_tab (no network wait, no error lines), and
    otherwise bounded by ``timeout`` seconds per socket operation, so an unreachable network fails instead of hanging.
    """
    import socket

    import nltk

    original = nltk.download

    def bounded(*args, **kwargs):
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(timeout)
        try:
            return original(*args, **kwargs)
        finally:
            socket.setdefaulttimeout(previous)

    def skipped(*args, **kwargs):
        return False

    nltk.download = bounded if punkt_needed else skipped
    try:
        yield
    finally:
        nltk.download = original


def import_builders(tasks) -> None:
    """Import lm-eval's RULER data builders once, inside :func:`nltk_guard` (their import is what downloads)."""
    if "lm_eval.tasks.ruler.prepare_niah" in sys.modules:
        return
    needed = needs_punkt(tasks)
    with nltk_guard(needed), contextlib.redirect_stdout(sys.stdout if needed else io.StringIO()):
        import lm_eval.tasks.ruler.prepare_niah  # noqa: F401  (it prints "Downloaded punkt_tab" whatever happened)
