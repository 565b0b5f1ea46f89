"""The package's models in lm-evaluation-harness: ``import hf_rope_ext.lm_eval`` registers the lm-eval model
``hf-rope-ext`` (:class:`~hf_rope_ext.lm_eval.model.RopeExtLM`, lm-eval's HFLM on a model loaded with any rope type).

lm-eval 0.4 finds models only in its own table (``lm_eval/models/__init__.py``) or among classes already imported;
it has no entry points for outside packages, so a plain ``lm_eval --model hf-rope-ext`` cannot find this class.
``python -m hf_rope_ext.lm_eval`` is lm-eval's own command line with the class registered first; it takes the same
arguments::

    python -m hf_rope_ext.lm_eval --model hf-rope-ext --model_args pretrained=DIR,rope_type=yarn,factor=4 \\
        --tasks niah_single_1 --metadata '{"max_seq_lengths": [32768]}' --limit 10
"""

from __future__ import annotations


def register() -> str:
    """Register the model class with lm-eval (idempotent: its decorator runs once, on import); returns its name."""
    from . import model

    return model.MODEL_NAME
