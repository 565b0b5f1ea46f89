"""Attention-level rope types, in layers a reader can follow:

- ``methods/``: one declaration per method (its bands, key ranges, positions, value treatment); no torch;
- ``engine/``: runs any declaration: a readable reference and a fast engine of standard attention pieces;
- ``rotation``: the one rotation of the package (float64 angles, either layout), the engine's and RoFormer's;
- ``layer`` (what a module's config asks for, resolved once) and ``function`` (the attention function
  transformers calls, through the seam in ``hf_rope_ext._transformers``).
"""
