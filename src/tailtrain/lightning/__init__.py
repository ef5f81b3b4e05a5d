"""tailtrain inside PyTorch Lightning (``pip install tailtrain[lightning]``): the remedy as a
DDP strategy (``StragglerStrategy``)."""

from tailtrain.lightning.strategy import StragglerStrategy

__all__ = ["StragglerStrategy"]
