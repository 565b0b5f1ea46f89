"""Where the answers of RULER needle cells come from: each answer's first number looked up in its own sample.

    .venv/bin/python experiments/ruler_answers.py --task niah_multikey_2 --lengths 16384 32768

For every cell of ``--results`` (default ``docs/results/ruler/results.json``, written by
``experiments/ruler_report.py``) with records of the task at those lengths, lm-eval's samples are built again as its
``simple_evaluate`` builds them (its default seeds, SmolLM2's tokenizer), each answer's sample found by its expected
value, and the answer's first number of 5 or more digits sorted into: the value asked, another 7-digit value of the same
prompt (another needle's), a number sharing its first four digits with one of those (a value copied wrong), another
number, or no number.
Records whose samples are not among those rebuilt (an earlier run with other settings) are listed as such.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from hf_rope_ext.eval import ruler, ruler_tasks
from hf_rope_ext.store import smollm2

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("asked", "another needle", "needle copied wrong", "other number", "no number")


def source(answer: str, expected, prompt: str) -> str:
    """The kind (one of ``KINDS``) of ``answer``'s first number against the ``expected`` values and the ``prompt``."""
    found = re.findall(r"\d{5,}", answer)
    if not found:
        return "no number"
    first = found[0]
    if first in expected:
        return "asked"
    values = set(re.findall(r"(?<!\d)\d{7}(?!\d)", prompt))  # the prompt's 7-digit values, each needle's
    if first in values:
        return "another needle"
    return "needle copied wrong" if any(v[:4] == first[:4] for v in values) else "other number"


def samples(task: str, length: int, tokenizer: str) -> dict[str, str]:
    """lm-eval's samples of ``task`` at ``length`` as ``simple_evaluate`` seeds them: expected value -> prompt."""
    import random

    import numpy
    import torch
    from lm_eval.evaluator import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
    from lm_eval.tasks import get_task_dict

    random.seed(DEFAULT_RANDOM_SEED)
    numpy.random.seed(DEFAULT_OTHER_SEED)
    torch.manual_seed(DEFAULT_OTHER_SEED)
    ruler_tasks.import_builders([task])
    manager = ruler.task_manager({"max_seq_lengths": [int(length)], "tokenizer": tokenizer})
    built = get_task_dict([task], manager)[task]
    return {doc["outputs"][0]: doc["input"] for doc in built.test_docs()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(ROOT / "docs" / "results" / "ruler" / "results.json"))
    parser.add_argument("--task", default="niah_multikey_2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    args = parser.parse_args()
    try:
        tasks = ruler_tasks.resolve([args.task], "--task")
    except ValueError as err:
        parser.error(str(err))
    if len(tasks) != 1:
        parser.error(f"--task {args.task!r}: one task, not {len(tasks)} ({', '.join(tasks)})")
    task = tasks[0]
    cells = json.loads(Path(args.results).read_text())
    tokenizer = str(smollm2.ensure())
    total = Counter()
    for length in args.lengths:
        prompts = samples(task, length, tokenizer)
        for key, cell in cells.items():
            for rec in cell["records"]:
                if rec["task"] != task or rec["length"] != length:
                    continue
                if any(a["expected"][0] not in prompts for a in rec["answers"]):
                    print(f"{length} {key}: samples not among those rebuilt")
                    continue
                kinds = [source(a["answer"], a["expected"], prompts[a["expected"][0]]) for a in rec["answers"]]
                total.update(kinds)
                print(f"{length} {key}: {', '.join(kinds)}")
    print("all:", ", ".join(f"{kind} {total[kind]}" for kind in KINDS))


if __name__ == "__main__":
    main()
