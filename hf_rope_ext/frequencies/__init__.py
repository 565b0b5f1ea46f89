"""Frequency-level methods: each module registers one rope_type that only changes inv_freq (and the cos/sin scale)."""

from . import dynamic_yarn, ntk, ntk_by_parts, part_ntk  # noqa: F401
