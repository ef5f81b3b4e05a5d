"""What a job can run, and the lines that adopt a recommendation (``advise --for``).

* ``ddp``: a job that keeps ``DistributedDataParallel`` can run what a DDP comm hook can do,
  sync and DropCompute (``StragglerHookState`` + ``weighted_allreduce_hook``; Local-SGD
  averages models, which a hook cannot);
* ``loop``: an own loop with :class:`tailtrain.StragglerStep` runs sync, DropCompute,
  Local-SGD (DropCompute App. B.3) and rebalance (its shares dealt by
  :class:`tailtrain.ShareSampler`: each epoch's global batches from the dataset), but not
  ``rebalance:deal=demand`` (:data:`TRAIN_ONLY`);
* ``tailtrain-train``: ``tailtrain train`` runs every strategy;
* ``any``: no restriction (every row, as before ``--for``).

:func:`adoption` gives the exact lines: a ``setup`` block run once after the model (and, for
DDP, its wrapper) exists, and a ``step`` block that replaces one step's forward, backward,
reduction and optimizer step; :data:`NAMES` are what those lines expect to exist in the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailtrain.errors import UsageError

#: setup -> the strategies it can run (None: every one)
RUNNABLE: dict[str, tuple[str, ...] | None] = {
    "ddp": ("sync", "dropcompute"),
    "loop": ("sync", "dropcompute", "local-sgd", "rebalance"),
    "tailtrain-train": None,
    "any": None,
}
#: options only ``tailtrain train`` runs: ``deal=demand`` deals each micro-batch from the
#: run's store, which a user's loop (``StragglerStep``) and a DDP hook do not have
TRAIN_ONLY = ("deal=demand",)
#: the job's own names the lines use: its model (``ddp`` for a DDP job), optimizer, the step's
#: list of micro-batches and a loss of one micro-batch; for rebalance its dataset, a
#: ``collate(dataset, indices)`` making one micro-batch, sync's M and the micro-batch size B
NAMES = ("model", "ddp", "optimizer", "micro_batches", "loss_fn", "dataset", "collate", "M", "B")


@dataclass(frozen=True)
class Adoption:
    """The change that adopts ``spec`` in a ``setup`` job (see the module docstring)."""

    setup: str
    spec: str
    imports: tuple[str, ...]
    once: tuple[str, ...]  # after the model, its optimizer (and DDP wrapper) exist
    step: tuple[str, ...]  # one training step, in place of the old one
    command: str | None = None  # tailtrain train's command line
    #: what ``step`` is run for: one training step, or (rebalance's sampler) one epoch
    each: str = "each step"

    def lines(self) -> list[str]:
        if self.command is not None:
            return [self.command]
        return [*self.imports, *self.once, f"# {self.each}:", *self.step]

    def as_dict(self) -> dict[str, object]:
        return {"for": self.setup, "spec": self.spec, "lines": self.lines()}


def check_setup(setup: str) -> str:
    if setup not in RUNNABLE:
        raise UsageError(f"--for {setup!r}: use one of {', '.join(RUNNABLE)}")
    return setup


def runnable(strategy: str, setup: str, spec: str | None = None) -> bool:
    """Whether a ``setup`` job can run ``strategy`` (a row's strategy family) at ``spec``:
    a spec of :data:`TRAIN_ONLY` needs ``tailtrain train``."""
    allowed = RUNNABLE[check_setup(setup)]
    if allowed is not None and spec is not None and any(o in spec for o in TRAIN_ONLY):
        return False
    return allowed is None or strategy in allowed


def adoption(spec: str, strategy: str, setup: str) -> Adoption:
    """The lines that make a ``setup`` job run ``spec`` (of family ``strategy``)."""
    if not runnable(strategy, setup, spec):
        raise UsageError(f"a {setup} job cannot run {spec!r}; advise --for {setup} never picks it")
    if setup in ("tailtrain-train", "any"):
        command = f'tailtrain train --strategy "{spec}"  # plus your run\'s other options'
        return Adoption(setup, spec, (), (), (), command)
    if strategy == "sync":
        keep = "# keep your step as it is: sync is what it runs"
        return Adoption(setup, spec, (), (keep,), ())
    if setup == "ddp":
        return Adoption(
            setup,
            spec,
            ("from tailtrain import StragglerHookState, weighted_allreduce_hook",),
            (
                f'state = StragglerHookState("{spec}")',
                "ddp.register_comm_hook(state, weighted_allreduce_hook)",
            ),
            (
                "for batch in state.micro_batches(ddp, micro_batches):",
                "    loss_fn(ddp, batch).backward()",
                "optimizer.step()",
                "optimizer.zero_grad()",
            ),
        )
    if strategy == "rebalance":  # the sampler deals each step's global batch by the shares
        return Adoption(
            setup,
            spec,
            ("from tailtrain import ShareSampler, StragglerStep",),
            (
                f'step = StragglerStep(model, optimizer, "{spec}", micro_batches=M)',
                "sampler = ShareSampler(len(dataset), step, micro_batch_size=B)",
            ),
            (
                "sampler.set_epoch(epoch)",
                "for indices in sampler:  # this rank's share of the step's global batch",
                "    batches = [collate(dataset, i) for i in indices]",
                "    step(batches, lambda batch: loss_fn(model, batch))",
            ),
            each="each epoch",
        )
    return Adoption(
        setup,
        spec,
        ("from tailtrain import StragglerStep",),
        (f'step = StragglerStep(model, optimizer, "{spec}")',),
        ("step(micro_batches, lambda batch: loss_fn(model, batch))",),
    )
