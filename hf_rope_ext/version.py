"""The package version (one place: ``hf_rope_ext.__version__``, the remote-code module name)."""

__version__ = "0.1.0"
