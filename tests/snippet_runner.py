"""Run documentation snippets, each in a process of its own: ``python snippet_runner.py JOBS.json RESULTS.json``.

JOBS is a list of ``{"name", "code", "cwd", "log"}``. The runner imports torch, transformers' modules and peft
once (the slow part), but not hf_rope_ext, then forks one child per snippet: the child starts from a fresh
``__main__`` namespace in ``cwd``, so a snippet must import everything it uses (``import hf_rope_ext`` included,
or the rope types are not registered). RESULTS maps each name to [exit status, seconds]; the output is in ``log``.
"""

import json
import os
import signal
import sys
import time
import traceback

import peft  # noqa: F401
import torch  # noqa: F401
import transformers.modeling_utils  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401
import transformers.models.roformer.modeling_roformer  # noqa: F401

TIMEOUT_S = 300


def run_child(job: dict) -> None:
    """In the forked child: redirect output to the log, run the snippet as __main__, exit with its status."""
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(job["cwd"])
    signal.alarm(TIMEOUT_S)
    status = 0
    try:
        exec(compile(job["code"], job["name"], "exec"), {"__name__": "__main__"})
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else int(err.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(jobs_path: str, results_path: str) -> None:
    results = {}
    for job in json.loads(open(jobs_path).read()):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(job)
        started = time.perf_counter()
        _, status = os.waitpid(pid, 0)
        results[job["name"]] = [os.waitstatus_to_exitcode(status), round(time.perf_counter() - started, 2)]
    with open(results_path, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(*sys.argv[1:3])
