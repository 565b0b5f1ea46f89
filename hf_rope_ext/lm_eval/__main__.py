"""``python -m hf_rope_ext.lm_eval ARGS``: lm-eval's command line (``lm_eval ARGS``) with the model
``hf-rope-ext`` registered and lm-eval's RULER data builders imported under the nltk guard
(``eval.ruler_tasks.nltk_guard``: no network wait for the tasks whose data is made locally)."""

from __future__ import annotations

import sys

from ..eval import ruler_tasks


def named_tasks(argv: list[str]) -> list[str]:
    """The task names given to ``--tasks`` (space- or comma-separated), as far as they can be read."""
    names, reading = [], False
    for word in argv:
        if word.startswith("--tasks="):
            names += word.split("=", 1)[1].split(",")
        elif word == "--tasks":
            reading = True
        elif reading and not word.startswith("-"):
            names += word.split(",")
        else:
            reading = False
    return [n for n in names if n]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        ruler_tasks.require_lm_eval()
    except ruler_tasks.MissingExtra as err:
        print(f"python -m hf_rope_ext.lm_eval: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    from . import register

    register()
    tasks = named_tasks(argv)
    if any(t in ruler_tasks.TASKS or t in ("ruler", "longcxt") for t in tasks):
        chosen = ruler_tasks.TASKS if {"ruler", "longcxt"} & set(tasks) else tasks
        for line in ruler_tasks.network_notes(chosen):
            print(f"note: {line}", file=sys.stderr)
        ruler_tasks.import_builders(chosen)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
