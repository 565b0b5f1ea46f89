"""Attention-level methods as declarations: each module registers one rope_type whose ``RopeMethod.attention``
(``form.AttentionForm``) says which bands its scores have, which keys each band covers, the positions its queries
and keys are rotated by, and how values and outputs are treated. Nothing here computes: ``attention.engine`` runs
every declaration, and nothing here imports torch (``hf-rope-ext list`` reads these modules)."""

from . import leaky_rerope, rerope, roper, self_extend, xpos  # noqa: F401  (each registers its rope_type)
