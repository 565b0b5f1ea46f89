"""Progress output, one switch for every command (``hf_rope_ext.util.progress``): bars on a terminal (one line left per
top-level loop, transformers' "Loading weights" never), plain lines every interval and no bars, carriage returns or
escape codes when stderr is a file, and nothing but the results with ``--no-progress``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from conftest import save_eval_llama

from hf_rope_ext.cli import main

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


def screen_lines(output: str) -> list[str]:
    """The lines a terminal shows at the end (and keeps in its scrollback) for ``output``: carriage returns overwrite,
    ESC[A moves up a line (tqdm's nested bars), ESC[K clears to the end of the line."""
    rows, row, col = [[]], 0, 0
    for token in re.findall(r"\x1b\[(\d*)([AK])|(\r)|(\n)|(.)", output, flags=re.S):
        count, code, cr, nl, char = token
        if code == "A":
            row = max(0, row - int(count or 1))
        elif code == "K":
            del rows[row][col:]
        elif cr:
            col = 0
        elif nl:
            row, col = row + 1, 0
            rows += [[] for _ in range(row + 1 - len(rows))]
        else:
            rows[row][col : col + 1] = [char]
            col += 1
    return ["".join(r).rstrip() for r in rows if "".join(r).strip()]


def bar_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "it/s]" in line or "s/it]" in line or "%|" in line]


def test_no_progress_silences_every_bar_on_a_terminal(docs_dir, tmp_path):
    model = save_eval_llama(tmp_path / "tiny")
    argv = eval_argv(model, docs_dir) + ["--passkey-depths", "0", "--last-chunk", "16"]
    status, output = run_on_terminal(argv)  # on a terminal the bars show (so the check below can fail) ...
    assert status == 0 and "perplexity @64" in output and "last chunk" in output, output
    assert "Loading weights" not in output  # transformers' bar at each model load: never (the package's loops report)
    assert bar_lines(screen_lines(output)) == []  # every loop of eval is nested: none is left on the screen
    status, output = run_on_terminal(argv + ["--no-progress"])  # ... and --no-progress silences every one
    assert status == 0, output
    assert "| none | - | 64 |" in output
    assert "it/s]" not in output and "\r" not in output.replace("\r\n", "\n")


def test_extend_on_a_terminal_leaves_one_bar_line(docs_dir, tmp_path):
    """Nested loops (perplexity, passkey, ... per method and length) and transformers' loading bars left ~60 lines."""
    model = save_eval_llama(tmp_path / "tiny")
    argv = [sys.executable, "-m", "hf_rope_ext", "extend", "--model", str(model), "--data", str(docs_dir)]
    argv += ["--factors", "2", "--documents", "1", "--passkey-depths", "0", "--last-chunk", "16"]
    argv += ["--report-dir", str(tmp_path / "r")]
    status, output = run_on_terminal(argv)
    assert status == 0, output
    lines = bar_lines(screen_lines(output))
    assert len(lines) == 1 and lines[0].startswith("methods: 100%"), lines


def run_to_log(argv: list[str], log: Path) -> str:
    """Run with stdout and stderr to the file ``log`` (no terminal); returns its text."""
    with log.open("w") as handle:
        status = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, env=ENV).returncode
    text = log.read_text()
    assert status == 0, text
    return text


def test_a_log_file_gets_no_bars_and_no_escape_codes(docs_dir, tmp_path):
    model = save_eval_llama(tmp_path / "tiny")
    module = [sys.executable, "-m", "hf_rope_ext"]
    commands = {
        "eval": eval_argv(model, docs_dir) + ["--passkey-depths", "0", "--last-chunk", "16"],
        "extend": [*module, "extend", "--model", str(model), "--data", str(docs_dir), "--factors", "2"]
        + ["--documents", "1", "--passkey-depths", "0", "--last-chunk", "16", "--report-dir", str(tmp_path / "r")],
        "finetune": [*module, *finetune_words(model, docs_dir, tmp_path / "ft")],
    }
    for name, argv in commands.items():
        text = run_to_log(argv, tmp_path / f"{name}.log")
        assert "\r" not in text and "\x1b[" not in text and "Loading weights" not in text, (name, text)
        assert "it/s" not in text and "%|" not in text, (name, text)
    assert "| none | - | 64 |" in (tmp_path / "eval.log").read_text()


def finetune_words(model, docs, out) -> list[str]:
    words = ["finetune", "--model", str(model), "--data", str(docs), "--out", str(out), "--rope-type", "ntk"]
    return words + ["--length", "128", "--max-steps", "2", "--eval-lengths", "128", "--eval-rows", "1", "--merge"]


def test_no_progress_prints_results_and_nothing_else(docs_dir, tmp_path, capsys):
    model = save_eval_llama(tmp_path / "tiny")
    commands = [
        ["eval", "--model", str(model), "--data", str(docs_dir), "--lengths", "64", "--passkey-depths", "0"]
        + ["--last-chunk", "16"],
        ["extend", "--model", str(model), "--data", str(docs_dir), "--factors", "2", "--documents", "1"]
        + ["--passkey-depths", "0", "--last-chunk", "16", "--rope-type", "ntk", "--factor", "2"]
        + ["--out", str(tmp_path / "x")],
        finetune_words(model, docs_dir, tmp_path / "ft"),
        ["export", str(tmp_path / "x"), str(tmp_path / "portable")],
        ["convert-layout", str(tmp_path / "x"), str(tmp_path / "interleaved"), "--to", "interleaved"],
        ["push", str(tmp_path / "portable"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "dry")],
    ]
    capsys.readouterr()  # what saving the model printed
    for argv in commands:
        assert main([*argv, "--no-progress"]) == 0
        out, err = capsys.readouterr()
        assert err == "" and out.strip(), (argv[0], err)


def test_a_long_step_in_a_log_still_prints_a_line_every_interval(docs_dir, tmp_path, capsys, monkeypatch):
    """In a log, a step that takes longer than the interval still shows the run is alive: the first training step
    waits until the progress timer has written a line (so the test takes no longer than the interval)."""
    from hf_rope_ext.train import loop
    from hf_rope_ext.util import progress

    lines, seen, stock = [], threading.Event(), loop.forward_loss
    monkeypatch.setattr(progress, "INTERVAL_S", 0.05)
    monkeypatch.setattr(progress, "emit", lambda text: (lines.append(text), seen.set()))

    def slow_forward(*args, **kwargs):
        assert seen.wait(timeout=120), "no progress line while a step ran"
        return stock(*args, **kwargs)

    monkeypatch.setattr(loop, "forward_loss", slow_forward)
    model = save_eval_llama(tmp_path / "tiny")
    words = ["finetune", "--model", str(model), "--data", str(docs_dir), "--out", str(tmp_path / "ft")]
    assert main([*words, "--rope-type", "ntk", "--length", "128", "--max-steps", "2"]) == 0
    assert any(re.fullmatch(r"progress \dm\d\ds: fine-tuning 0/2", line) for line in lines), lines
    assert "\r" not in capsys.readouterr().err
