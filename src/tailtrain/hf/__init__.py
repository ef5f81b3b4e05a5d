"""tailtrain in Hugging Face's ``transformers.Trainer``: the straggler probe as a callback,
and rebalance by per-rank batch shares as a ``Trainer`` subclass.

    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(StragglerProbeCallback("runs/probe", trainer=trainer))

    trainer = RebalancedTrainer(model=model, args=args, train_dataset=data, shares=[14, 2])

The Trainer owns its loop (Accelerate's DDP, its micro-batches, its ``no_sync``), so a user
cannot wrap its loader or its step; its callbacks see each optimizer step begin and end,
which is where [`StragglerProbeCallback`][tailtrain.hf.StragglerProbeCallback] opens and
closes the probe's step. Rebalance changes only the training loader, the DDP model's
reduction and the loss's scale, which the Trainer's documented overrides reach
([`RebalancedTrainer`][tailtrain.hf.RebalancedTrainer]); DropCompute needs the loop itself,
which neither a callback nor those overrides change: docs/hf.md says what a Trainer user does
instead. Needs the ``hf`` extra (``pip install 'tailtrain[hf]'``); ``import tailtrain`` never
imports it.
"""

try:
    import transformers  # noqa: F401  (the extra's check: one line where it is missing)
except ImportError:
    raise ImportError(
        "tailtrain.hf needs transformers and accelerate: pip install 'tailtrain[hf]'"
    ) from None

from tailtrain.hf.callback import StragglerProbeCallback
from tailtrain.hf.rebalance import RebalancedTrainer

__all__ = ["RebalancedTrainer", "StragglerProbeCallback"]
