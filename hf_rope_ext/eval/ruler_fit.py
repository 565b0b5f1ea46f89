"""Refuse, before any work, a RULER task whose lm-eval builder would loop forever at this length with this tokenizer.

lm-eval 0.4.13's variable-tracking and common-words builders (``vt_utils``, ``cwe_utils``) search for the largest
haystack that fits, starting from a small one; when even that one does not fit they go on with an empty haystack,
which raises inside a ``while True: try ... except: pass`` loop that never ends. That happens with a byte-level
tokenizer (``ruler_vt`` sizes its in-context example to 500 tokens, which takes about 930 bytes) or at a short length.
Each check here builds that smallest sample with lm-eval's own generator and counts its tokens as the builder does.
"""

from __future__ import annotations

VT_EXAMPLE_LENGTH = 500  # vt_utils.get_dataset: the in-context example is sized to this many tokens
VT_GENERATE, VT_FIRST_NOISES, VT_EXAMPLE_NOISES = 30, 10, 5
CWE_GENERATE, CWE_FIRST_WORDS = 120, 10


def tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text).input_ids)


def smallest_vt(tokenizer, length: int) -> list[tuple[str, int, int]]:
    """(what, tokens of the smallest sample plus generation, tokens allowed) for ruler_vt's two searches."""
    from lm_eval.tasks.ruler import vt_utils

    text, answer = vt_utils.generate_input_output(VT_EXAMPLE_NOISES, 1, 4, is_icl=True)
    example = tokens(tokenizer, text + f" {answer}")
    text, answer = vt_utils.generate_input_output(VT_FIRST_NOISES, 1, 4, is_icl=False)
    sample = tokens(tokenizer, text + f" {answer}")  # the example grows to at most 500 - 30 tokens
    return [
        ("its in-context example", example + VT_GENERATE, VT_EXAMPLE_LENGTH),
        ("its smallest sample with the example", sample + VT_EXAMPLE_LENGTH, length),
    ]


def smallest_cwe(tokenizer, length: int) -> list[tuple[str, int, int]]:
    from lm_eval.tasks.ruler import cwe_utils

    example, text, answer = cwe_utils.generate_input_output(CWE_FIRST_WORDS, length)
    listed = " ".join(f"{i + 1}. {word}" for i, word in enumerate(answer))
    return [("its smallest sample", tokens(tokenizer, example + "\n" + text + " " + listed) + CWE_GENERATE, length)]


CHECKS = {"ruler_vt": smallest_vt, "ruler_cwe": smallest_cwe}


def check_fits(tasks, tokenizer, lengths) -> None:
    """ValueError naming the task, the length and the token counts when a builder of ``tasks`` would loop forever."""
    import random

    state = random.getstate()  # lm-eval seeds its own run; leave the caller's random state as it was
    try:
        for task in tasks:
            for length in sorted(lengths):
                for what, needed, allowed in CHECKS.get(task, lambda *_: [])(tokenizer, int(length)):
                    if needed > allowed:
                        fix = "leave the task out" if what.startswith("its in-context") else "give a longer length"
                        raise ValueError(
                            f"--ruler {task} at {length} tokens: {what} takes {needed} tokens with this tokenizer, "
                            f"more than the {allowed} lm-eval's builder allows, and the builder would then loop "
                            f"forever; {fix}"
                        )
    finally:
        random.setstate(state)
