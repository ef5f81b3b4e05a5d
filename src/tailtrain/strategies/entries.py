"""Which entry in a user's own job runs which rule: each entry's declared capability, and the
one query over them (E6).

Four entries run a rule inside a job the user keeps, all on the allreduce topology and all
fed by the user's data loader:

* :data:`LOOP`: :class:`tailtrain.StragglerStep` in an own loop; it deals per-rank shares
  (``Strategy.needs``: ``shares``, its ``ShareSampler``) and the pool on demand (``demand``:
  positions of the loop's stream, from the job's rendezvous store, ``integrate.demand``), but
  not a threshold's cut carried to the next step, which needs the run's own data;
* :data:`HOOK`: ``StragglerHookState`` with ``weighted_allreduce_hook``, a DDP comm hook: it
  reduces gradients once per step, so it deals nothing beyond the protocol and cannot run a
  rule that averages models after local steps (``Strategy.averages_models``);
* :data:`SHARE_LOADER`: ``rebalance_loader`` with ``sample_weighted_hook``, a DDP job's
  per-rank batch shares, fixed where ``advise`` computed them: plain ``rebalance`` only;
* :data:`SHARDED`: ``ShardedStep``, an own loop over an FSDP2 model across replica groups:
  sync, DropCompute, Local-SGD and rebalance, by shares or on demand (it deals stream
  positions from the job's store), but not a threshold's cut carried by ``defer=true``;
* :data:`LIGHTNING`: ``tailtrain.lightning.StragglerStrategy``, Lightning's DDP strategy
  running the same comm hook over ``accumulate_grad_batches``: what the hook runs.

:meth:`Entry.refusal` answers for one of them with the contracts the engines use
(``strategies.base.contract_refusal``, ``engine_refusal``), so ``integrate``'s own checks
(``integrate.rounds.as_strategy``) and ``advise --for`` (``advice.adopt``) give one answer,
and a new allreduce strategy reaches both with no table to edit. ``tailtrain train`` runs
each rule on its own topology (``runtime.launching.topologies``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tailtrain.strategies.base import Strategy, Topology, contract_refusal, engine_refusal
from tailtrain.strategies.names import on

#: strategy options that need the data loader's cooperation, which a user's job keeps
LOADER_COMPENSATIONS = ("larger-batch", "resample")


@dataclass(frozen=True)
class Entry:
    """What one entry in a user's job declares it can run (module docstring)."""

    #: how a refusal names it
    name: str
    #: what it deals beyond the allreduce protocol (``Strategy.needs``)
    does: frozenset[str] = frozenset()
    #: it reduces inside DDP's comm hook: gradients once per step, no model average
    hook: bool = False
    #: the only specs it runs (None: every rule the contracts admit)
    specs: tuple[str, ...] | None = None
    #: the only families it runs so far (None: every family the contracts admit)
    families: tuple[str, ...] | None = None

    def refusal(self, rule: Strategy) -> str | None:
        """Why this entry cannot run ``rule``, in one line; None if it can."""
        if self.specs is not None and rule.describe() not in self.specs:
            return f"{self.name} runs {', '.join(self.specs)} only, not {rule.describe()!r}"
        if self.families is not None and rule.name not in self.families:
            return f"{self.name} runs {', '.join(self.families)} for now, not {rule.describe()!r}"
        refusal = loop_refusal(rule, self.does)
        if refusal is None and self.hook and rule.averages_models:
            return hook_refusal(rule)
        return refusal


def loop_refusal(rule: Strategy, does: frozenset[str] = frozenset()) -> str | None:
    """Why a user's job whose entry ``does`` these extras cannot run ``rule``; None if it can:
    an allreduce rule whose weights and plans that entry can apply, and no compensation that
    changes which micro-batches a round gets (the job's loader decides that)."""
    if rule.topology is not Topology.ALLREDUCE:
        return (
            f"strategy {rule.describe()!r} needs the {rule.topology} topology; a training loop "
            f"adopts allreduce strategies: {', '.join(on(Topology.ALLREDUCE.value))}"
        )
    refusal = contract_refusal(rule, Topology.ALLREDUCE) or engine_refusal(rule, does)
    if refusal is not None:
        return refusal
    compensate = getattr(rule, "compensate", "none")
    if compensate in LOADER_COMPENSATIONS:
        return (
            f"{rule.describe()!r}: compensate={compensate} changes which micro-batches a "
            "round gets, which your data loader decides; use compensate=extra-steps or none"
        )
    return None


def hook_refusal(rule: Strategy, local_steps: int | None = None) -> str:
    """Why a DDP comm hook cannot run ``rule``: it averages models every ``local_steps``
    (default: its period) local steps, and a hook reduces gradients once per step."""
    steps = getattr(rule, "period", None) if local_steps is None else local_steps
    every = "after local steps" if steps is None else f"every {steps} local steps"
    every = "after each local step" if steps == 1 else every
    return (
        f"{rule.describe()!r} averages models {every}, which a DDP comm hook cannot do; use "
        "tailtrain.integrate.StragglerStep (or torch's PostLocalSGDOptimizer)"
    )


#: ``StragglerStep``: an own loop; its ``ShareSampler`` deals per-rank shares, and the step deals
#: positions of the loop's stream on demand
LOOP = Entry("StragglerStep", does=frozenset({"shares", "demand"}))
#: ``StragglerHookState`` + ``weighted_allreduce_hook``: DDP's comm hook
HOOK = Entry("the DDP comm hook", hook=True)
#: ``rebalance_loader`` + ``sample_weighted_hook``: a DDP job's fixed per-rank batch shares
SHARE_LOADER = Entry(
    "rebalance_loader", does=frozenset({"shares"}), hook=True, specs=("rebalance",)
)
#: ``ShardedStep``: an own loop over an FSDP2 model, the replica group as the worker; the rules
#: whose group lockstep is built (``integrate.sharded``'s docstring says why the others wait)
SHARDED = Entry(
    "ShardedStep",
    does=frozenset({"shares", "demand"}),
    families=("sync", "dropcompute", "local-sgd", "rebalance"),
)
#: ``tailtrain.lightning.StragglerStrategy``: Lightning's DDP strategy with that comm hook
LIGHTNING = Entry("tailtrain.lightning.StragglerStrategy", hook=True)
