"""When the lines of a committed JSON-lines log reached the repository, read from git: each line's first commit, and
what changed in the package's attention code between a log's first and last lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = "docs/results/real-model/"
MERGE = "cd02b51"  # the compiled-decode merge: attention-level types under torch.compile, eager decode steps


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def first_commits(log: str) -> dict[str, dict]:
    """prompt_id -> {"commit", "date", "after_merge", "recorded"}: the first commit whose copy of ``log`` (a file under
    LOGS) holds the line, whether the line names its own commit (``provenance``), and whether that commit contains
    MERGE (over every commit that touched the file, merges included, oldest first)."""
    path, out = LOGS + log, {}
    history = git("log", "--reverse", "--full-history", "-m", "--format=%h %cI", "--", path).split("\n")
    for order, entry in enumerate(dict.fromkeys(line for line in history if line)):
        commit, date = entry.split()
        after = subprocess.run(["git", "merge-base", "--is-ancestor", MERGE, commit], cwd=ROOT).returncode == 0
        for line in map(json.loads, git("show", f"{commit}:{path}").splitlines()):
            first = {"commit": commit, "date": date, "after_merge": after, "recorded": "provenance" in line}
            first["order"] = order  # the commit's place in the file's history (dates may tie)
            out.setdefault(line["prompt_id"], first)
    return out


def time_range(logs: list[str]) -> str:
    """When the lines of ``logs`` that name no commit of their own reached the repository (first and last commit, UTC)
    and the commits to the package's attention code in between (lines with their provenance: not counted)."""
    firsts = [f for log in logs for f in first_commits(log).values() if not f["recorded"]]
    seen = [(date, commit) for _, date, commit in sorted({(f["order"], f["date"], f["commit"]) for f in firsts})]
    (start, first), (end, last) = seen[0], seen[-1]
    changes = git("log", "--format=%h", f"{first}..{last}", "--", "hf_rope_ext/attention").split()
    between = f"; the attention code changed in between ({', '.join(changes)})" if changes else ""
    return f"the lines reached the repository between {first} ({start}) and {last} ({end}){between}"
