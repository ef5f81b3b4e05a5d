"""tailtrain in a Lightning ``Trainer``: the optional extra ``pip install 'tailtrain[lightning]'``.

* ``StragglerProbeCallback``: one line in ``Trainer(callbacks=[...])`` measures every rank's
  optimizer steps (data, compute, wait in DDP's allreduce, samples), names the slow ranks
  through the trainer's loggers and writes the ``trace.csv`` ``tailtrain advise`` reads
  (``tailtrain.lightning.probe``; docs/lightning.md).
"""

try:
    import lightning  # noqa: F401
except ImportError as error:  # the extra is not installed
    raise ImportError(
        "tailtrain.lightning needs Lightning: pip install 'tailtrain[lightning]'"
    ) from error

from tailtrain.lightning.probe import StragglerProbeCallback

__all__ = ["StragglerProbeCallback"]
