"""Where a fine-tuning run writes: a hidden sibling of ``--out`` (``.OUT.partial``), renamed to ``--out`` at the end.

- A run that fails (bad data found late, out of memory, a crash) before its first checkpoint leaves nothing behind:
  the partial folder is removed, so the same command can simply be run again.
- A run stopped after a checkpoint (Ctrl-C, or a failure) becomes ``--out`` holding its checkpoints and logs, without
  an adapter: ``--resume-from OUT/checkpoints/step-N`` continues it there, and a resumed run writes into ``--out``
  itself (a failure leaves it as resumable as it was).
- Files are moved into place with the user's umask (``outputs.apply_umask``).

The folder's name is fixed (not random) so that every process of a launch writes into the same one; only the main
process creates, renames or removes it.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

from ..store.outputs import apply_umask
from .checkpoints import latest_checkpoint
from .csv_log import LOG_FILE
from .interrupt import Interrupted


def work_dir(out, resume_from=None) -> Path:
    """``--out`` when resuming into it, else its hidden partial sibling."""
    out = Path(out)
    return out if resume_from else out.parent / f".{out.name}.partial"


def log_dir(out, resume_from=None, log_dir=None) -> Path:
    """``--log-dir``, else ``logs`` inside the folder being written."""
    return Path(log_dir) if log_dir else work_dir(out, resume_from) / "logs"


def check_free(out, resume_from=None) -> None:
    """A partial folder already there belongs to a run in progress, or to one that was killed outright."""
    work = work_dir(out, resume_from)
    if work != Path(out) and work.exists():
        raise FileExistsError(
            f"--out {str(out)!r}: {str(work)!r} exists, the partial folder of a run into it that is still going or "
            "was killed; wait for it, or remove that folder"
        )


@contextmanager
def run_folder(accelerator, out, resume_from=None, custom_log_dir=None):
    """Around the run's writes (into :func:`work_dir`): on success the folder becomes ``out``; on a failure see the
    module docstring. Every process enters it; the main process alone touches the folders."""
    out, work = Path(out), work_dir(out, resume_from)
    try:
        yield work
    except BaseException as err:
        if isinstance(err, Interrupted) and work != out:  # its checkpoint, where it will be
            err.checkpoint = out / err.checkpoint.relative_to(work)
        if accelerator.is_main_process and work != out:
            _keep_or_discard(work, out, custom_log_dir)
        raise
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        apply_umask(work)
        if work != out:
            work.rename(out)
    accelerator.wait_for_everyone()


def _keep_or_discard(work: Path, out: Path, custom_log_dir) -> None:
    """A failed fresh run: ``out`` when it reached a checkpoint (resumable), else nothing left behind."""
    if latest_checkpoint(work / "checkpoints") is not None:
        apply_umask(work)
        work.rename(out)
        return
    shutil.rmtree(work, ignore_errors=True)
    if custom_log_dir:  # the log this run started there (a second run into that folder is refused while it exists)
        (Path(custom_log_dir) / LOG_FILE).unlink(missing_ok=True)
