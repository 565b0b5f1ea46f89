"""hf_rope_ext: RoPE context-extension methods for Hugging Face transformers 5.x.

Importing the package registers its rope types into transformers (idempotently).
"""

from ._transformers import install as _install
from .configure import rope_parameters_for
from .export import export  # portable export (issue 8); the function shadows the submodule's attribute name
from .layout import convert_layout
from .models.roformer import install as _install_roformer
from .registry import available_rope_types, get_method

__version__ = "0.1.0"
__all__ = ["available_rope_types", "convert_layout", "export", "get_method", "rope_parameters_for", "__version__"]

_install()
_install_roformer()
