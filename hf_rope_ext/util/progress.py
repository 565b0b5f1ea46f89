"""The one switch for progress output, used by every command and every loop of the package that takes a while.

Three modes, chosen once per process (:func:`configure`, which the command calls with ``--no-progress``):

- ``bars`` (stderr is a terminal): tqdm bars; a bar nested in another is removed when done, so a run leaves one line
  per top-level loop;
- ``lines`` (stderr is a file or a pipe): no bars and no carriage returns; while any loop runs, one plain line every
  :data:`INTERVAL_S` seconds names every loop open and how far it got, written by a timer thread, so that a step that
  takes minutes still shows the run is alive (``progress 2m30s: methods 3/11 | perplexity @2048 1/3``);
- ``off`` (``--no-progress``): nothing.

:func:`bar` is what the loops call instead of ``tqdm``: ``bar(iterable, desc=...)``, or ``bar(total=n)`` with
``update`` and ``set_postfix``; ``enabled=False`` silences one loop (a process that is not the main one).
"""

from __future__ import annotations

import sys
import threading
import time

INTERVAL_S = 15.0  # seconds between two lines in ``lines`` mode
MODES = ("bars", "lines", "off")
_mode: str | None = None  # None: decided when a loop starts, from stderr


def configure(enabled: bool = True) -> str:
    """``off`` when not ``enabled``, else ``bars`` on a terminal and ``lines`` elsewhere; returns the mode."""
    global _mode
    _mode = "off" if not enabled else ("bars" if sys.stderr.isatty() else "lines")
    return _mode


def mode() -> str:
    """The configured mode; unconfigured (the package used from Python): bars on a terminal or in a notebook."""
    return _mode or ("bars" if sys.stderr.isatty() or "ipykernel" in sys.modules else "lines")


def bar(iterable=None, *, desc="", total=None, initial=0, unit="it", nested=True, enabled=True):
    """A progress bar over ``iterable`` (or one counted from ``initial`` with ``update``) in the current mode.
    ``nested=False``: a top-level loop, whose finished bar stays on the terminal."""
    chosen = mode() if enabled else "off"
    if chosen == "lines":
        return Lines(iterable, desc, total, initial)
    from tqdm.auto import tqdm

    leave, off = not nested, chosen == "off"
    return tqdm(iterable, desc=desc, total=total, initial=initial, unit=unit, leave=leave, disable=off)


class Lines:
    """A loop reported by the timer's plain lines (see the module docstring); the tqdm calls the package uses."""

    def __init__(self, iterable=None, desc: str = "", total=None, initial: int = 0):
        self.iterable, self.desc, self.n, self.postfix = iterable, desc, initial, ""
        self.total = total if total is not None else _length(iterable)
        TICKER.open(self)

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.n += 1
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        TICKER.close(self)

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def status(self) -> str:
        count = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        return " ".join(part for part in (self.desc, count, self.postfix and f"({self.postfix})") if part)


def _length(iterable):
    try:
        return len(iterable)
    except TypeError:
        return None


def emit(text: str) -> None:
    """Write one progress line to stderr."""
    print(text, file=sys.stderr, flush=True)


class Ticker:
    """The timer thread of ``lines`` mode: runs while at least one loop is open, one line per interval."""

    def __init__(self):
        self.open_loops: list[Lines] = []
        self.lock = threading.Lock()
        self.stop: threading.Event | None = None
        self.started = 0.0

    def open(self, loop: Lines) -> None:
        with self.lock:
            self.open_loops.append(loop)
            if self.stop is None:
                self.started, self.stop = time.monotonic(), threading.Event()
                threading.Thread(target=self.run, args=(self.stop,), daemon=True).start()

    def close(self, loop: Lines) -> None:
        with self.lock:
            if loop in self.open_loops:
                self.open_loops.remove(loop)
            if not self.open_loops and self.stop is not None:
                self.stop.set()
                self.stop = None

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(INTERVAL_S):
            with self.lock:
                text = self.line()
            if text:
                emit(text)

    def line(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        loops = " | ".join(loop.status() for loop in self.open_loops)
        return f"progress {elapsed // 60}m{elapsed % 60:02d}s: {loops}" if loops else ""


TICKER = Ticker()
