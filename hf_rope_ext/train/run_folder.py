"""Where a fine-tuning run writes: a hidden sibling of ``--out`` (``.OUT.partial``), renamed to ``--out`` at the end.

- A run that fails (bad data found late, out of memory, a crash) before its first checkpoint leaves nothing behind:
  the partial folder is removed, so the same command can simply be run again.
- A run stopped after a checkpoint (Ctrl-C, or a failure) becomes ``--out`` holding its checkpoints and logs, without
  an adapter: ``--resume-from OUT/checkpoints/step-N`` continues it there, and a resumed run writes into ``--out``
  itself (a failure leaves it as resumable as it was).
- A run whose processes were killed (SIGKILL, a lost node) stays in the partial folder, which then holds its
  checkpoints: ``--resume-from .OUT.partial/checkpoints/step-N`` (the newest complete one) with the same ``--out``
  continues it there, keeping the log's rows up to that step, and the folder becomes ``--out`` when it ends. A new run
  into ``--out`` is refused meanwhile, with a message that names that checkpoint and the option.
- Files are moved into place with the user's umask (``outputs.apply_umask``).

The folder's name is fixed (not random) so that every process of a launch writes into the same one; only the main
process creates, renames or removes it.
"""

from __future__ import annotations

import shlex
import shutil
from contextlib import contextmanager
from pathlib import Path

from ..store.outputs import apply_umask
from .checkpoints import NAME, latest_checkpoint
from .csv_log import LOG_FILE
from .interrupt import Interrupted


def partial_dir(out) -> Path:
    """The hidden sibling ``.OUT.partial`` of ``--out`` that a run writes into."""
    out = Path(out)
    return out.parent / f".{out.name}.partial"


def work_dir(out, resume_from=None) -> Path:
    """The partial folder, except for a run resumed from a checkpoint outside it: ``--out`` itself."""
    out = Path(out)
    if resume_from and not lies_in(resume_from, partial_dir(out)):
        return out
    return partial_dir(out)


def lies_in(path, folder) -> bool:
    """Whether ``path`` is ``folder`` or under it (both resolved)."""
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def log_dir(out, resume_from=None, log_dir=None) -> Path:
    """``--log-dir``, else ``logs`` inside the folder being written."""
    return Path(log_dir) if log_dir else work_dir(out, resume_from) / "logs"


def newest_checkpoint(out) -> Path | None:
    """The complete checkpoint of the highest step that a run into ``out`` left, in ``out`` or its partial folder."""
    found = [c for c in (latest_checkpoint(Path(f) / "checkpoints") for f in (out, partial_dir(out))) if c]
    return max(found, key=lambda c: int(NAME.fullmatch(c.name).group(1)), default=None)


def resume_advice(checkpoint) -> str:
    """How to continue the run that wrote ``checkpoint``: the option and its value, exactly."""
    return (
        f"its newest complete checkpoint is {str(checkpoint)!r}: continue the run with the same command and "
        f"--resume-from {shlex.quote(str(checkpoint))}"
    )


def check_free(out, resume_from=None) -> None:
    """A partial folder already there belongs to a run in progress, or to one that was killed outright: a new run is
    refused (naming the checkpoint to resume from when it holds one). A run resumed from a checkpoint in it continues
    there, unless ``--out`` exists too (the folder could not become it)."""
    out, partial = Path(out), partial_dir(out)
    if resume_from and lies_in(resume_from, partial):
        if out.exists():
            raise FileExistsError(
                f"--resume-from {str(resume_from)!r} lies in {str(partial)!r}, the partial folder of --out "
                f"{str(out)!r}, and --out exists too, so the resumed run could not become it; resume into a new --out"
            )
        return
    if work_dir(out, resume_from) != partial or not partial.exists():
        return
    found = latest_checkpoint(partial / "checkpoints")
    if found is not None:
        raise FileExistsError(
            f"--out {str(out)!r}: {str(partial)!r} exists, the partial folder of a run into it that is still going or "
            f"was killed; if it is still going, wait for it; if it was killed, {resume_advice(found)}"
        )
    raise FileExistsError(
        f"--out {str(out)!r}: {str(partial)!r} exists, the partial folder of a run into it that is still going or "
        "was killed before its first complete checkpoint; wait for it, or remove that folder"
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
    """A failed run in the partial folder: ``out`` when it holds a complete checkpoint (resumable), else nothing left
    behind."""
    if latest_checkpoint(work / "checkpoints") is not None:
        apply_umask(work)
        work.rename(out)
        return
    shutil.rmtree(work, ignore_errors=True)
    if custom_log_dir:  # the log this run started there (a second run into that folder is refused while it exists)
        (Path(custom_log_dir) / LOG_FILE).unlink(missing_ok=True)
