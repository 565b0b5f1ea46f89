"""``python tests/kill_process.py -m hf_rope_ext finetune ...`` (or ``tests/kill_process.py SCRIPT ARGS...``): the
program, with one process of the launch killed by SIGKILL at a known point of training, as the kernel's OOM killer or a
lost node ends it (no Python cleanup runs):

- ``KILL_AT=before-checkpoint`` (default): once step ``KILL_STEP`` is logged, before its checkpoint is written;
- ``KILL_AT=writing``: while step ``KILL_STEP``'s checkpoint is written, before the killed process writes its part.

``KILL_RANK`` (default 1) is the rank killed; it prints ``killing rank R at step N`` first. The other processes stop
there too (those writing a checkpoint write their own part first) and wait until the launcher ends them, so that none
reaches a collective that the dead process would never join: the run leaves its folder as a run whose processes all
died does, and a test knows where, whatever the machine's load."""

import os
import runpy
import signal
import sys
import time
from pathlib import Path

from hf_rope_ext.train import checkpoints, loop

STEP = int(os.environ["KILL_STEP"])
AT = os.environ.get("KILL_AT", "before-checkpoint")
RANK = int(os.environ.get("KILL_RANK", "1"))


def stop_here() -> None:
    """SIGKILL on rank ``RANK``; on the others, wait to be ended by the launcher."""
    if int(os.environ.get("RANK", "0")) == RANK:
        print(f"killing rank {RANK} at step {STEP} ({AT})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 600  # a launcher that never ends this process fails the test instead of hanging
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise SystemExit("kill_process.py: the launcher did not end this process in 600 s")


stock_checkpoint, stock_write_parts = loop.checkpoint, checkpoints.write_parts


def checkpoint(run, step):
    if step == STEP:
        stop_here()
    stock_checkpoint(run, step)


def write_parts(accelerator, directory):
    if Path(directory).name.startswith(f"step-{STEP:06d}"):
        if int(os.environ.get("RANK", "0")) != RANK:
            stock_write_parts(accelerator, directory)
        stop_here()
    stock_write_parts(accelerator, directory)


if AT == "before-checkpoint":
    loop.checkpoint = checkpoint
elif AT == "writing":
    checkpoints.write_parts = write_parts
else:
    raise SystemExit(f"kill_process.py: KILL_AT={AT!r}; expected before-checkpoint or writing")

if sys.argv[1] == "-m":  # a module, as python -m runs it
    module, sys.argv = sys.argv[2], [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:  # a script, with its own arguments
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
