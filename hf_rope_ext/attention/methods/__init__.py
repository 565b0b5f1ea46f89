"""Attention-level methods as declarations: each module declares one rope_type (``METHOD``) whose
``RopeMethod.attention`` (``form.AttentionForm``) says which bands its scores have, which keys each band covers, the
positions its queries and keys are rotated by, and how values and outputs are treated. Nothing here computes:
``attention.engine`` runs every declaration, and nothing here imports torch (``hf-rope-ext list`` reads these
modules); ``registry`` registers every one of ``METHODS``."""

from . import dual_chunk, leaky_rerope, rerope, roper, self_extend, string, xpos

METHODS = (
    dual_chunk.METHOD,
    leaky_rerope.METHOD,
    rerope.METHOD,
    roper.METHOD,
    self_extend.METHOD,
    string.METHOD,
    xpos.METHOD,
)
