"""The attention engine: runs any method's declaration (``attention.methods.form``) for one layer call.

- ``call``: what one call is (tensors, query and key positions, chunk masks);
- ``reference``: explicit scores per band and query chunk, readable (``eager``; the tests' oracle);
- ``fast``: standard attention pieces returning their log-sum-exp, merged by it (``sdpa``): ``single_band``,
  ``two_band`` (prefill), ``decode``, ``masked``; pieces (``pieces``) run on the device's kernel (``kernels``,
  ``flex`` for CUDA) and are merged by ``lse``;
- ``treatments``: xPos's decay and RoPER's values as both engines apply them; ``rotation``: float64-angle
  rotations; ``rotated_cache``: rotated rows remembered across decode steps.
"""
