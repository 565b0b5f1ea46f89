"""Progress output: ``--no-progress`` silences every bar (transformers' "Loading weights" included), and a stderr
that is not a terminal (a log file, a pipe) gets no bars and no carriage-return or escape codes."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from test_eval import docs_dir, save_tiny  # noqa: F401  (docs_dir is a fixture)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def eval_argv(model, docs) -> list[str]:
    return [sys.executable, "-m", "hf_rope_ext", "eval", "--model", str(model), "--data", str(docs), "--lengths", "64"]


def run_on_terminal(argv: list[str]) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal (as in an interactive shell); returns (status, output)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns, or bars are empty
    process = subprocess.Popen(argv, stdout=follower, stderr=follower, env=ENV)
    os.close(follower)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:  # the terminal closed: the process ended
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    status = process.wait(timeout=300)
    reader.join(timeout=30)
    os.close(leader)
    return status, b"".join(chunks).decode(errors="replace")


def test_no_progress_silences_every_bar_on_a_terminal(docs_dir, tmp_path):  # noqa: F811
    model = save_tiny(tmp_path / "tiny")
    argv = eval_argv(model, docs_dir) + ["--passkey-depths", "0", "--last-chunk", "0"]
    status, output = run_on_terminal(argv)  # on a terminal the bars show (so the check below can fail) ...
    assert status == 0 and "Loading weights" in output and "perplexity @64" in output, output
    status, output = run_on_terminal(argv + ["--no-progress"])  # ... and --no-progress silences every one
    assert status == 0, output
    assert "| none | - | 64 |" in output
    assert "Loading weights" not in output and "it/s]" not in output and "\r" not in output.replace("\r\n", "\n")


def test_a_log_file_gets_no_bars_and_no_escape_codes(docs_dir, tmp_path):  # noqa: F811
    model = save_tiny(tmp_path / "tiny")
    log = tmp_path / "eval.log"
    with log.open("w") as handle:  # no --no-progress: a file is not a terminal
        argv = eval_argv(model, docs_dir) + ["--passkey-depths", "0", "--last-chunk", "16"]
        status = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, env=ENV).returncode
    text = log.read_text()
    assert status == 0, text
    assert "| none | - | 64 |" in text
    assert "\r" not in text and "\x1b[" not in text and "Loading weights" not in text and "it/s" not in text
