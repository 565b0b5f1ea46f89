"""``hf_rope_ext.util.progress``, the one switch: bars (tqdm) on a terminal, plain lines from a timer when stderr is a
file, nothing when off; a loop's plain line names every open loop and how far it got."""

from __future__ import annotations

import threading

import pytest

from hf_rope_ext.util import progress


@pytest.fixture
def lines_mode(monkeypatch):
    """Lines mode with a short interval; the lines written, and an event set at each."""
    written, seen = [], threading.Event()
    monkeypatch.setattr(progress, "_mode", "lines")
    monkeypatch.setattr(progress, "INTERVAL_S", 0.01)
    monkeypatch.setattr(progress, "emit", lambda text: (written.append(text), seen.set()))
    return written, seen


def test_a_line_names_every_open_loop_and_stops_with_them(lines_mode):
    written, seen = lines_mode
    for method in progress.bar(["yarn", "ntk"], desc="methods", nested=False):
        for _ in progress.bar(range(3), desc=f"perplexity {method}"):
            seen.clear()
            assert seen.wait(timeout=60)  # the step lasts until the timer has written (no timing assumed)
    assert any(line.endswith("methods 0/2 | perplexity yarn 0/3") for line in written)
    assert all(line.startswith("progress 0m") for line in written)
    assert any("methods 1/2 | perplexity ntk 2/3" in line for line in written)
    assert progress.TICKER.open_loops == [] and progress.TICKER.stop is None  # the timer ended with the loops


def test_a_counted_loop_reports_its_postfix_and_a_resumed_start(lines_mode):
    written, seen = lines_mode
    with progress.bar(total=10, initial=4, desc="fine-tuning", nested=False) as steps:
        steps.update(1)
        steps.set_postfix(loss="1.2345")
        seen.clear()
        assert seen.wait(timeout=60)
    assert written[-1].endswith("fine-tuning 5/10 (loss 1.2345)")


def test_off_and_disabled_loops_write_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "_mode", "off")
    assert list(progress.bar(range(3), desc="x")) == [0, 1, 2]
    monkeypatch.setattr(progress, "_mode", "bars")
    assert list(progress.bar(range(3), desc="x", enabled=False)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
