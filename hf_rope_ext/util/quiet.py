"""Warnings that ordinary use of the package would print and that a user can do nothing about, each dropped exactly
where the package causes it (a filter around that one call, matching that one message), and nowhere else.

- peft (0.21) reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model (FutureWarning);
- transformers 5.24 deprecates ``gradient_checkpointing_enable`` for ``activation_checkpointing_enable`` (5.17 has
  only the old name): :func:`enable_activation_checkpointing` calls whichever the installed release has;
- ``generate`` beyond ``max_position_embeddings`` logs a "friendly reminder": reading past the trained length is what
  a long-context evaluation is for.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

PEFT_ALIAS = r"`is_gradient_checkpointing` is deprecated"
REMINDER = "This is a friendly reminder - the current text generation call has exceeded"
STOPPING_LOGGER = "transformers.generation.stopping_criteria"


@contextmanager
def peft_wrapping():
    """Around ``get_peft_model`` / ``PeftModel.from_pretrained``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_ALIAS, category=FutureWarning)
        yield


class _DropReminder(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(REMINDER)


@contextmanager
def generating_past_max_length():
    """Around ``generate`` calls that read past the trained length on purpose."""
    logger, dropped = logging.getLogger(STOPPING_LOGGER), _DropReminder()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def enable_activation_checkpointing(model, **kwargs) -> None:
    """Activation (gradient) checkpointing with ``kwargs`` (e.g. use_reentrant), by the installed release's name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
