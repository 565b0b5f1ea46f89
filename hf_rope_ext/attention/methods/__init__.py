"""Attention-level methods as declarations: each module declares one rope_type (``METHOD``) whose
``RopeMethod.attention`` (``form.AttentionForm``) says which bands its scores have, which keys each band covers, the
positions its queries and keys are rotated by, and how values and outputs are treated. Nothing here computes:
``attention.engine`` runs every declaration, and nothing here imports torch (``hf-rope-ext list`` reads these
modules); each module registers its declaration into the table (``types.registry``) when imported."""

from . import dual_chunk, leaky_rerope, rerope, roper, self_extend, string, xpos  # noqa: F401  (each registers)
