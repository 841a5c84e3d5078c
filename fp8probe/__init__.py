"""fp8probe: per-layer FP8 sensitivity, mismatch-budgeted FP8 recipes, and what they buy in KV cache.

Importing the package touches no device and configures no logging; transformers and pandas load
inside the functions that need them.
"""

__version__ = "0.1.0"

from .errors import FP8ProbeError
from .fp8 import KVCacheScheme, Scheme, fake_quant
from .student import Student, Unit, load_student

__all__ = [
    "__version__",
    "FP8ProbeError",
    "Scheme",
    "KVCacheScheme",
    "fake_quant",
    "Student",
    "Unit",
    "load_student",
]
