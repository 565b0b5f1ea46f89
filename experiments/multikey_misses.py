"""What the three-key probe's misses answer: each miss of the real-model report looked up in its own prompt.

    .venv/bin/python experiments/multikey_misses.py                 # every three-key record
    .venv/bin/python experiments/multikey_misses.py --lengths 32768

For every record of ``--results`` (default ``docs/results/real-model/results.json``, written by
``experiments/real_model_report.py``) with three keys a prompt, the prompts' keys are drawn again as
``hf_rope_ext.eval.multikey.multikey_accuracy`` draws them (its ``prompt_keys``, seed 0, three a prompt, planted in
that order from the start of the prompt to its end) and each miss's first number of 4 or more digits is sorted
into: another key of the same prompt planted after the one asked (nearer the question) or before it (farther back),
a number sharing its first three digits with a key of the prompt (a key copied wrong), another number, or no number.
The last line also counts the misses by the key asked: the first, second or third planted (the red door, the blue
box, the green gate of every prompt).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from hf_rope_ext.eval.multikey import DEFAULT_KEYS, prompt_keys

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ("first planted", "second planted", "third planted")
KINDS = ("key nearer the question", "key farther back", "key copied wrong", "other number", "no number")


def kind(answer: str, asked: int, planted: list[int]) -> str:
    """The kind (one of ``KINDS``) of a miss: ``answer``'s first number against the keys of its prompt, in the
    order they are planted (``asked`` among them)."""
    found = re.findall(r"\d{4,}", answer)
    if not found:
        return "no number"
    number = int(found[0])
    if number in planted and number != asked:
        later = planted.index(number) > planted.index(asked)
        return KINDS[0] if later else KINDS[1]
    copied = any(str(k)[:3] == found[0][:3] for k in planted)
    return "key copied wrong" if copied else "other number"


def prompts_of(probes: int, keys: int = DEFAULT_KEYS) -> dict[int, list[int]]:
    """Each key of a record of ``probes`` probes -> the keys of its prompt, in the order they are planted."""
    return {key: group for group in prompt_keys(probes // keys, keys) for key in group}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(ROOT / "docs" / "results" / "real-model" / "results.json"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    args = parser.parse_args()
    total, asked_as = Counter(), Counter()
    for key, records in json.loads(Path(args.results).read_text()).items():
        if key.startswith("baseline:") or ":1key" in key:
            continue
        for rec in (r for r in records if r["length"] in args.lengths):
            prompt = prompts_of(rec["multikey_probes"])
            if any(asked not in prompt for _, asked, _ in rec["multikey_misses"]):
                print(f"{rec['length']} {key}: keys not among those drawn again")
                continue
            kinds = Counter(kind(text, asked, prompt[asked]) for _, asked, text in rec["multikey_misses"])
            total.update(kinds)
            asked_as.update(prompt[asked].index(asked) for _, asked, _ in rec["multikey_misses"])
            shown = ", ".join(f"{k} {kinds[k]}" for k in KINDS if kinds[k])
            print(f"{rec['length']} {key}: {len(rec['multikey_misses'])} misses: {shown or '-'}")
    print("all:", ", ".join(f"{k} {total[k]}" for k in KINDS))
    print("by the key asked:", ", ".join(f"{name} {asked_as[i]}" for i, name in enumerate(PLANTED)))


if __name__ == "__main__":
    main()
