"""tailtrain: keep data-parallel PyTorch training fast when some workers are slow."""

from tailtrain.errors import TailtrainError, UsageError

__all__ = ["TailtrainError", "UsageError", "__version__"]
__version__ = "0.1.0"
