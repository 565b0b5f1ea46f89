"""Frequency-level methods: each module declares and registers one rope_type (``METHOD``) that only changes inv_freq
(and the cos/sin scale). Importing this package registers them all (``hf_rope_ext.load_methods``)."""

from . import dynamic_yarn, ntk, ntk_by_parts, part_ntk  # noqa: F401  (each registers its method)
