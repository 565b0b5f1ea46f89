"""Frequency-level methods: each module declares one rope_type (``METHOD``) that only changes inv_freq (and the
cos/sin scale); ``registry`` registers every one of ``METHODS``."""

from . import dynamic_yarn, ntk, ntk_by_parts, part_ntk

METHODS = (dynamic_yarn.METHOD, ntk.METHOD, ntk_by_parts.METHOD, part_ntk.METHOD)
