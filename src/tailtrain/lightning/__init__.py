"""tailtrain in a Lightning ``Trainer``: the optional extra ``pip install 'tailtrain[lightning]'``.

* ``StragglerProbeCallback``: one line in ``Trainer(callbacks=[...])`` measures every rank's
  optimizer steps (data, compute, wait in DDP's allreduce, samples), names the slow ranks
  through the trainer's loggers and writes the ``trace.csv`` ``tailtrain advise`` reads
  (``tailtrain.lightning.probe``; docs/lightning.md).
* ``StragglerStrategy``: ``Trainer(strategy=StragglerStrategy("dropcompute:threshold=auto"),
  accumulate_grad_batches=M)`` runs DropCompute (or ``rebalance`` by fixed per-rank shares)
  inside Lightning's automatic optimization, the ``accumulate_grad_batches`` batches as the
  micro-batches, with the same rule objects and comm hook as a plain DDP job
  (``tailtrain.lightning.strategy``).
"""

try:
    import lightning  # noqa: F401
except ImportError as error:  # the extra is not installed
    raise ImportError(
        "tailtrain.lightning needs Lightning: pip install 'tailtrain[lightning]'"
    ) from error

from tailtrain.lightning.probe import StragglerProbeCallback
from tailtrain.lightning.strategy import StragglerStrategy

__all__ = ["StragglerProbeCallback", "StragglerStrategy"]
