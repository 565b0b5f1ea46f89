"""The attention engine: runs any method's declaration (``attention.methods.form``) for one layer call.

- ``call``: what one call is (tensors, query and key positions, chunk masks);
- ``reference``: explicit scores per band and query chunk, readable (``eager``; the tests' oracle);
- ``fast``: standard attention pieces returning their log-sum-exp, merged by it (``sdpa``): ``single_band``,
  ``two_band`` (prefill), ``masked``, ``chunk_bands``, and the decode steps ``decode`` (two bands),
  ``single_band_decode`` and ``chunk_decode``, whose few rotations ``step_turns`` does in as few operations as
  possible, with nothing read back from a GPU; pieces (``piece``) run on the device's kernel (``kernels``,
  ``flex`` for CUDA; ``split_keys`` splits a CPU decode piece along its keys) and are merged by ``lse``, a decode
  step's pieces once (``union``);
- while torch.compile traces a call (``attention.function.attend_traced``), ``reference`` alone, with masks built
  from positions on the device;
- ``decay_and_value_turns``: xPos's decay and RoPER's values as both engines apply them; ``rotated_cache``: rotated
  rows remembered across decode steps; ``static_rows``: a static cache layer's keys turned as they are written, in
  buffers of fixed shapes and addresses, for the compiled step. Rotations (float64 angles, either layout) are
  ``attention.rotation``'s.
"""
