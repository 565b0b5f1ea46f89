"""``experiments/log_history.py``: the time range of a log's lines that name no commit of their own is read from git
over those lines alone; lines appended later with their provenance leave it as it was."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import load_script

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def commit_lines(repo: Path, log: Path, lines: list[dict]) -> str:
    """Append ``lines`` to ``log`` and commit; the commit's short hash."""
    with log.open("a") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    env = {**os.environ, **GIT_ENV}
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, capture_output=True, text=True, check=True)  # noqa: E731
    run("add", "-A")
    run("commit", "-q", "-m", "lines")
    return run("rev-parse", "--short=7", "HEAD").stdout.strip()


def test_the_time_range_reads_the_lines_without_provenance_only(tmp_path, monkeypatch):
    history = load_script("log_history")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    log = tmp_path / history.LOGS / "x.jsonl"
    log.parent.mkdir(parents=True)
    first = commit_lines(tmp_path, log, [{"prompt_id": "a"}])
    second = commit_lines(tmp_path, log, [{"prompt_id": "b"}])
    later = commit_lines(tmp_path, log, [{"prompt_id": "c", "provenance": {"commit": "f" * 40}}])
    monkeypatch.setattr(history, "ROOT", tmp_path)
    found = history.time_range(["x.jsonl"])
    assert f"between {first} (" in found and f"and {second} (" in found and later not in found, found
    assert [f["recorded"] for f in history.first_commits("x.jsonl").values()] == [False, False, True]
