"""Out of memory, the one failure that is neither bad input nor a bug: one line saying what ran out and what to try.

Recognised without importing torch (the command starts without it): Python's ``MemoryError``, torch's
``OutOfMemoryError`` (CUDA, MPS) and the CPU allocator's ``RuntimeError`` ("can't allocate memory").
"""

from __future__ import annotations

OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")
HINTS = {
    "finetune": "try --grad-checkpointing, a smaller --batch-size (with --grad-accum), --precision bf16, a shorter "
    "--length or PoSE windows (--position-schedule pose --window N)",
    "eval": "try shorter --lengths, fewer --documents, or a machine with more memory",
    "extend": "try smaller --factors (shorter lengths), --passkey-depths 0, or a machine with more memory",
}
DEFAULT_HINT = "try a smaller input or a machine with more memory"


def out_of_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    return isinstance(err, RuntimeError) and any(text in str(err).lower() for text in OOM_TEXT)


def out_of_memory_message(command: str, err: BaseException) -> str:
    """``out of memory (<the first line of the error>); <what to try for this command>``."""
    lines = str(err).strip().splitlines()
    return f"out of memory ({lines[0] if lines else type(err).__name__}); {HINTS.get(command, DEFAULT_HINT)}"
