"""Ctrl-C during training: a request to stop after the current optimizer step (:class:`StopRequest`), and the
error that names the checkpoint written there (:class:`Interrupted`)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after optimizer step ``step``; ``checkpoint`` holds that step."""

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"interrupted after step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint = step, Path(checkpoint)


class StopRequest:
    """While active: the first SIGINT asks the loop to stop after its current step, a second one interrupts at once.
    Only in the main thread (signal handlers cannot be set elsewhere) and where SIGINT is not ignored."""

    DUPLICATE_S = 1.0  # a launcher forwards the terminal's Ctrl-C to its workers: a repeat this soon is that copy

    def __init__(self, announce: bool = True):
        self.asked, self._previous, self._first, self.announce = False, None, 0.0, announce

    def __enter__(self):
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored (a background job): stays so
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *_exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, _signum, _frame):
        if self.asked and time.monotonic() - self._first > self.DUPLICATE_S:
            raise KeyboardInterrupt
        if self.asked:
            return
        self.asked, self._first = True, time.monotonic()
        if self.announce:
            print("\nCtrl-C: stopping after this step, saving a checkpoint (Ctrl-C again: stop now)", file=sys.stderr)
