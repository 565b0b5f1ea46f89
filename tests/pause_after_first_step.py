"""``python tests/pause_after_first_step.py finetune ...``: the ``hf-rope-ext finetune`` command (as ``python -m
hf_rope_ext``), except that after its first optimizer step it prints ``paused after step 1`` and waits until Ctrl-C
(SIGINT) has reached the run's stop request. A test can so interrupt a run at a known step whatever the machine's load
(a timed SIGINT could come after a short run had ended)."""

import runpy
import time

from hf_rope_ext.train import loop

stock = loop.after_step


def after_step(run, step, index, loss):
    row = stock(run, step, index, loss)
    if step == 1:
        print("paused after step 1", flush=True)
        deadline = time.monotonic() + 600  # a test that never sends the signal fails instead of hanging
        while not run.stop.asked:  # set by the SIGINT handler the run installed
            if time.monotonic() > deadline:
                raise SystemExit("pause_after_first_step.py: no SIGINT reached the run in 600 s")
            time.sleep(0.01)
    return row


loop.after_step = after_step
runpy.run_module("hf_rope_ext", run_name="__main__", alter_sys=True)
