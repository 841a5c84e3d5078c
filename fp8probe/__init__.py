"""fp8probe: per-layer FP8 sensitivity, mismatch-budgeted FP8 recipes, and what they buy in KV cache.

Importing the package touches no device and configures no logging; transformers and pandas load
inside the functions that need them.
"""

__version__ = "0.1.1"

from .errors import FP8ProbeError
from .fp8 import KVCacheScheme, Scheme, fake_quant
from .measure import measure
from .mismatch import METRICS, mismatch
from .rollouts import Rollouts, load_rollouts, make_rollouts, save_rollouts
from .student import Student, Unit, load_student
from .sweep import sweep
from .recipe import Recipe, make_recipe, read_recipe_yaml
from .capacity import capacity
from .export import export  # llm-compressor itself is imported on first use

__all__ = [
    "__version__",
    "FP8ProbeError",
    "Scheme",
    "KVCacheScheme",
    "fake_quant",
    "Student",
    "Unit",
    "load_student",
    "Rollouts",
    "make_rollouts",
    "save_rollouts",
    "load_rollouts",
    "METRICS",
    "mismatch",
    "sweep",
    "measure",
    "Recipe",
    "make_recipe",
    "read_recipe_yaml",
    "export",
    "capacity",
]
