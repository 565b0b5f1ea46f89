"""The attention engine: runs any method's declaration (``attention.methods.form``) for one layer call.

- ``call``: what one call is (tensors, query and key positions, chunk masks);
- ``reference``: explicit scores per band and query chunk, readable (``eager``; the tests' oracle);
- ``fast``: standard attention pieces returning their log-sum-exp, merged by it (``sdpa``): ``single_band``,
  ``two_band`` (prefill), ``decode``, ``masked``, ``chunk_bands``; pieces (``piece``) run on the device's kernel
  (``kernels``, ``flex`` for CUDA) and are merged by ``lse``;
- ``decay_and_value_turns``: xPos's decay and RoPER's values as both engines apply them; ``rotated_cache``: rotated
  rows remembered across decode steps. Rotations (float64 angles, either layout) are ``attention.rotation``'s.
"""
