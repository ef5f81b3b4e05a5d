r"""What a job can run, and the lines that adopt a recommendation (``advise --for``).

* ``ddp``: a job that keeps ``DistributedDataParallel`` can run what a DDP comm hook can do:
  sync, DropCompute (``StragglerHookState`` + ``weighted_allreduce_hook``, at the M
  micro-batches per step advise names) and rebalance by per-rank batch shares
  (``rebalance_loader`` + ``sample_weighted_hook``); Local-SGD averages models, which a hook
  cannot;
* ``loop``: an own loop with :class:`tailtrain.StragglerStep` runs sync, DropCompute,
  Local-SGD (DropCompute App. B.3) and rebalance (its shares dealt by
  :class:`tailtrain.ShareSampler`: each epoch's global batches from the dataset;
  ``rebalance:deal=demand``: positions of the job's stream, dealt from its rendezvous store);
* ``lightning``: a Lightning ``Trainer`` runs what ``tailtrain.lightning.StragglerStrategy``
  runs: the DDP comm hook's rules over ``accumulate_grad_batches`` (DropCompute at the M
  advise names) and rebalance by fixed per-rank shares, one ``strategy=`` argument;
* ``hf``: transformers' ``Trainer`` is ranked as a DDP job. Rebalance by shares runs inside
  it (``tailtrain.hf.RebalancedTrainer``: its loader, its DDP model's comm hook and its loss
  are reached by documented overrides), and the line is that subclass in place of
  ``Trainer``; DropCompute does not (a callback cannot cut a micro-batch nor reduce:
  docs/hf.md), so its lines are the DDP job's, for the loop the user moves the remedy to,
  under a line that says so;
* ``fsdp``: an own loop over an FSDP2 model (``fully_shard`` over a 2-D mesh's shard
  dimension) runs what :class:`tailtrain.ShardedStep` runs, the replica group as the worker,
  ``rebalance:deal=demand`` included (it deals positions of the job's stream);
* ``tailtrain-train``: ``tailtrain train`` runs every strategy;
* ``any``: no restriction (every row, as before ``--for``).

Which strategy a ``ddp`` or ``loop`` job can run is not listed here: :func:`runnable` asks the
entries that job adopts a rule with (:data:`SETUPS`), each of which declares what it runs
(``strategies.entries``: the contracts ``integrate`` checks the rule with), so a new
allreduce strategy reaches ``--for loop`` with no edit here.

:func:`adoption` gives the exact lines: a ``setup`` block run once after the model (and, for
DDP, its wrapper) exists, and a ``step`` block that replaces one step's forward, backward,
reduction and optimizer step; :data:`NAMES` are what those lines expect to exist in the job.

For ``--for ddp`` the lines are a complete change to the loop shapes it names (a DDP job with
one batch per step and ``DistributedSampler``, a ``Trainer`` class holding them as
attributes, gradient accumulation under ``no_sync``), printed with canonical names
(:data:`CANONICAL`), and :meth:`Adoption.edits` says the same change as edits that
``tailtrain.advice.patch.apply_edits`` applies to a script: each an ``anchor`` (a regex the
loop shape contains; a named group binds the canonical name it is named after to the
script's own, e.g. ``self.train_data`` for ``loader``), an ``action`` (``insert_after`` the
anchored statement, or ``replace`` the anchored lines, where ``\g<name>`` inserts a group's
text), ``lines`` and ``binds``; ``renames`` (canonical name -> a new name: in the groups'
text the script's own name for it becomes the new one); and, where a shape cannot take the
change, ``unless`` (a regex such a script contains) and ``why``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from tailtrain.errors import UsageError
from tailtrain.strategies.entries import HOOK, LIGHTNING, LOOP, SHARDED, SHARE_LOADER, Entry

#: setup (``--for``) -> the entries its job adopts a rule with (``strategies.entries``); None:
#: every strategy (``tailtrain train`` runs each on its own topology; ``any`` keeps every row)
SETUPS: dict[str, tuple[Entry, ...] | None] = {
    "ddp": (HOOK, SHARE_LOADER),
    "loop": (LOOP,),
    "lightning": (LIGHTNING, SHARE_LOADER),
    "hf": (HOOK, SHARE_LOADER),
    "fsdp": (SHARDED,),
    "tailtrain-train": None,
    "any": None,
}
#: the job's own names the lines use: its model (``ddp`` for a DDP job), optimizer, the step's
#: list of micro-batches and a loss of one micro-batch; for rebalance its dataset, a
#: ``collate(dataset, indices)`` making one micro-batch, sync's M and the micro-batch size B
NAMES = ("model", "ddp", "optimizer", "micro_batches", "loss_fn", "dataset", "collate", "M", "B")
#: the names ``--for ddp``'s lines use for the job's own (``advice.patch`` renames them)
CANONICAL = ("loader", "ddp", "optimizer", "model", "loss", "x", "y", "sampler")
#: the first top-level import (not ``__future__``): the imports go after it
IMPORT_ANCHOR = r"^(?:import|from)[ \t]+(?!__future__\b)\S"
#: the first assignment of the loader the step's batches come from (bound by
#: :data:`BATCH_ANCHOR`): ``loader = DataLoader(...)``, or the DDP tutorial's
#: ``self.train_data = train_data`` with the ``DataLoader`` built in a helper
LOADER_ANCHOR = r"^[ \t]*loader[ \t]*=(?!=)"
#: ``ddp = DDP(model, ...)`` or ``DistributedDataParallel(...)``
DDP_ANCHOR = r"^[ \t]*(?P<ddp>[\w.]+)[ \t]*=[ \t]*(?:[\w.]+\.)?(?:DistributedDataParallel|DDP)\("
#: the step's batch: ``for x, y in loader:`` (or ``enumerate(loader)``, or the probe's
#: ``probe.batches(loader)``); binds ``x``, ``y`` and the loader
BATCH_ANCHOR = (
    r"^[ \t]*for[ \t]+(?:\w+[ \t]*,[ \t]*\(?)?\(?(?P<x>\w+)[ \t]*,[ \t]*(?P<y>\w+)\)?\)?"
    r"[ \t]+in[ \t]+(?:enumerate\()?(?:[\w.]*probe\.batches\()?(?P<loader>[\w.]+)\b"
)
#: the loop header the probe wraps: ``for x, y in loader:`` (its two names kept)
PROBED_ANCHOR = (
    r"^[ \t]*for[ \t]+(?P<x>\w+)[ \t]*,[ \t]*(?P<y>\w+)[ \t]+in[ \t]+(?P<loader>[\w.]+)[ \t]*:"
)
#: the step's forward through its backward, lines at one indentation: wrapped per micro-batch
STEP_ANCHOR = (
    r"^(?P<indent>[ \t]*)(?P<body>[^\n]*\bddp\([^\n]*\n(?:(?P=indent)(?![ \t\n])[^\n]*\n)*?"
    r"(?P=indent)(?P<loss>[\w.]+)\.backward\(\)[^\n]*)$"
)
#: the optimizer's step, guarded under DropCompute
OPTIMIZER_ANCHOR = r"^[ \t]*(?P<optimizer>[\w.]*opt\w*)\.step\(\)[ \t]*$"
#: the micro-batch's names in the step's forward and backward (``renames``: the batch's own
#: names there become these, so the loop's x and y still hold the whole batch after it)
MICRO = {"x": "x_micro", "y": "y_micro"}
#: why DropCompute's edits refuse a loop that accumulates gradients under ``no_sync``
ACCUMULATION = (
    "this loop accumulates gradients under no_sync: DropCompute's hook takes a step's "
    "micro-batches as one list (state.micro_batches(ddp, micro_batches)); make the step one "
    "loader batch split in M as the printed lines do, or adopt rebalance"
)

#: a loop that scales its loss (``torch.amp.GradScaler``): the printed lines screen an
#: overflow out, which the scaler must see (``StragglerHookState``'s ``on_nonfinite``)
SCALED = r"\bGradScaler\("
#: why the DDP edits refuse such a loop, and what to write by hand
SCALED_WHY = (
    'this loop scales its loss with a GradScaler: add on_nonfinite="propagate" to the '
    "printed StragglerHookState(...) or rebalance_loader(...) line, so that an overflow "
    "reaches the scaler, and guard scaler.step(optimizer) and scaler.update() as the printed "
    "lines guard optimizer.step() (docs/loop.md); adopt the lines by hand"
)


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
    #: the same change as edits (module docstring); () where none is needed or known
    edit_list: tuple[dict[str, Any], ...] = ()
    #: the script's last lines, before ``destroy_process_group()`` (a comm hook's teardown)
    end: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        if self.command is not None:
            return [self.command]
        ending = [f"# {ENDING}:", *self.end] if self.end else []
        if not self.step:
            return [*self.imports, *self.once, *ending]
        return [*self.imports, *self.once, f"# {self.each}:", *self.step, *ending]

    def edits(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.edit_list]

    def as_dict(self) -> dict[str, object]:
        return {"for": self.setup, "spec": self.spec, "lines": self.lines(), "edits": self.edits()}


def _edit(
    anchor: str, lines: list[str], binds: str | None, action: str = "insert_after", **more: str
) -> dict[str, Any]:
    return {"anchor": anchor, "action": action, "lines": lines, "binds": binds, **more}


#: where a comm hook's lines end the script (``Adoption.end``)
ENDING = "at the end, before dist.destroy_process_group()"
#: the ending of a job whose DDP model holds a comm hook: a DDP model that still holds a
#: Python comm hook once its group is destroyed can hang or abort the exit (torch's own
#: ``allreduce_hook`` too); dropped first, its reducer goes while the group lives
HOOK_END = ("del ddp  # a DDP model with a comm hook must go before its process group",)
#: a statement that starts with ``dist.destroy_process_group()`` (or torch.distributed's, or
#: imported bare), the rest of its line kept: ``del ddp`` goes before it, where the DDP model
#: is a name assigned before it in the same function (``plain``)
TEARDOWN_ANCHOR = (
    r"^[ \t]*(?P<teardown>(?:(?:torch\.)?(?:distributed|dist)\.)?destroy_process_group\(\).*)$"
)


def _teardown() -> dict[str, Any]:
    """``del ddp`` before the script's ``destroy_process_group()``; skipped where the script
    has none there, or where the DDP model is not a name assigned before it in the same
    function (``self.model``; a ``cleanup()`` helper, or ``__main__`` after ``main()``:
    where that name does not reach)."""
    return _edit(TEARDOWN_ANCHOR, [HOOK_END[0], "\\g<teardown>"], None, "replace", plain="ddp")


def _import(names: str) -> dict[str, Any]:
    return _edit(IMPORT_ANCHOR, [f"from tailtrain import {names}"], None)


def ddp_rebalance(spec: str, shares: tuple[int, ...]) -> Adoption:
    """Rebalance a DDP job by per-rank batch shares: two lines, the loop's step unchanged
    (``tailtrain.integrate`` ``rebalance_loader`` and ``sample_weighted_hook``)."""
    names = "rebalance_loader, sample_weighted_hook"
    deal = f"loader = rebalance_loader(loader, shares={list(shares)})"
    hook = "ddp.register_comm_hook(loader.batch_sampler, sample_weighted_hook)"
    return Adoption(
        "ddp",
        spec,
        (f"from tailtrain import {names}",),
        (
            f"{deal}  # after {_loader_of(shares)}",
            f"{hook}  # after ddp = DDP(model) and the line above",
        ),
        (),
        edit_list=(
            _import(names),
            _edit(BATCH_ANCHOR, [], "loader"),  # binds only: the loader the batches come from
            _edit(LOADER_ANCHOR, [deal], "loader", unless=SCALED, why=SCALED_WHY),
            _edit(DDP_ANCHOR, [hook], "ddp"),
            _teardown(),
        ),
        end=HOOK_END,
    )


def _loader_of(shares: tuple[int, ...]) -> str:
    """The loader the shares deal, its batch size named: the shares sum to N times it, so a
    loop whose loader's batch differs sees that the line is not for it."""
    batch, rest = divmod(sum(shares), len(shares))
    return (
        f"loader = DataLoader(..., batch_size={batch})" if rest == 0 else "loader = DataLoader(...)"
    )


def ddp_dropcompute(spec: str, m: int) -> Adoption:
    """DropCompute in a DDP job with one batch per step: the hook, and the step's batch
    split in ``m`` micro-batches, its forward and backward run per micro-batch, the update
    guarded (``tailtrain.integrate.ddp``'s loop)."""
    names = "StragglerHookState, weighted_allreduce_hook"
    state = [
        f'state = StragglerHookState("{spec}")',
        "ddp.register_comm_hook(state, weighted_allreduce_hook)",
    ]
    # names of their own: the loop's x and y stay the step's whole batch after it
    split = (
        f"for x_micro, y_micro in state.micro_batches(ddp, list(zip(x.chunk({m}), y.chunk({m})))):"
    )
    guard = [
        "if not state.last.empty:  # no rank's gradient entered: no update",
        "    optimizer.step()",
    ]
    return Adoption(
        "ddp",
        spec,
        (f"from tailtrain import {names}",),
        (f"{state[0]}  # after ddp = DDP(model)", state[1]),
        (
            "optimizer.zero_grad()",
            split,
            "    loss = loss_fn(ddp(x_micro), y_micro)  # your forward and loss, per micro-batch",
            "    loss.backward()",
            *guard,
        ),
        each=f"each step (its batch x, y split in M={m} micro-batches)",
        edit_list=(
            _import(names),
            _edit(DDP_ANCHOR, state, "ddp", unless=SCALED, why=SCALED_WHY),
            _edit(BATCH_ANCHOR, [], "x"),  # binds x, y and the loader: the batch split below
            _edit(
                STEP_ANCHOR,
                [split, "    \\g<body>"],
                "loss",
                "replace",
                unless=r"\.no_sync\(",
                why=ACCUMULATION,
                renames=MICRO,
            ),
            _edit(OPTIMIZER_ANCHOR, guard, "optimizer", "replace"),
            _teardown(),
        ),
        end=HOOK_END,
    )


def probe_adoption(out_dir: str = "runs/probe") -> Adoption:
    """The probe's two lines in a DDP job with a loader (the README's "measure" step), as
    lines and as edits for ``advice.patch.apply_edits``: the probe watches the DDP model and
    wraps the loop's loader."""
    watch = f'probe = StragglerProbe("{out_dir}").watch(ddp)'
    loop = "for x, y in probe.batches(loader):"
    return Adoption(
        "ddp",
        "probe",
        ("from tailtrain import StragglerProbe",),
        (f"{watch}  # after ddp = DDP(model)",),
        (f"{loop}  # was: for x, y in loader:",),
        each="the loop over the loader",
        edit_list=(
            _import("StragglerProbe"),
            _edit(DDP_ANCHOR, [watch], "ddp"),
            _edit(PROBED_ANCHOR, [loop], "loader", "replace"),
        ),
    )


#: setups whose jobs deal per-rank batch shares by ``advise``'s per-sample forecast
SHARES = ("ddp", "lightning", "hf", "any")
#: where transformers' Trainer's user adopts a remedy the Trainer cannot run (docs/hf.md)
HF_MOVE = (
    "# transformers' Trainer cannot run this in its loop (docs/hf.md, \"DropCompute: not "
    "inside the Trainer\"): in a loop you own over DDP (Accelerate's or your own), these lines"
)


def hf_rebalance(spec: str, shares: tuple[int, ...]) -> Adoption:
    """Rebalance in a transformers ``Trainer`` job: its subclass that deals the training
    loader by ``shares`` and weighs DDP's reduction by them (``tailtrain.hf``'s
    ``RebalancedTrainer``), the per-device batch the shares sum to N times named, so that a
    job with another batch sees the line is not for it (as ``_loader_of``)."""
    batch, rest = divmod(sum(shares), len(shares))
    was = "# was: Trainer(...)" + (f", per_device_train_batch_size={batch}" if rest == 0 else "")
    line = f"trainer = RebalancedTrainer(..., shares={list(shares)})  {was}"
    # a newcomer's job built its own Trainer subclass: that class is where the line goes
    own = "# a Trainer subclass of your own: derive it from RebalancedTrainer, the same shares="
    return Adoption("hf", spec, ("from tailtrain.hf import RebalancedTrainer",), (line, own), ())


def lightning_adoption(
    spec: str,
    strategy: str,
    micro_batches: int | None,
    shares: tuple[int, ...] | None,
    accumulation: int = 1,
) -> Adoption:
    """The ``Trainer(...)`` argument that runs ``spec`` in a Lightning job
    (``tailtrain.lightning.StragglerStrategy``): rebalance by ``shares``, or the hook's rule
    over ``accumulate_grad_batches``, set to the ``micro_batches`` advise priced it at, the
    loader's batch resized so that a step keeps its samples (``accumulation``: the loader
    batches a step accumulates now)."""
    imports = ("from tailtrain.lightning import StragglerStrategy",)
    if strategy == "rebalance":
        line = f'strategy=StragglerStrategy("rebalance", shares={list(shares or ())}),'
        return Adoption("lightning", spec, imports, (f"trainer = Trainer(..., {line[:-1]})",), ())
    arguments = [f'strategy=StragglerStrategy("{spec}")']
    if micro_batches is not None:
        arguments.insert(0, f"accumulate_grad_batches={micro_batches}")
    once = [f'trainer = Trainer(..., {", ".join(arguments)})  # was strategy="ddp"']
    if micro_batches is not None and micro_batches != accumulation:
        factor = Fraction(accumulation, micro_batches)  # the loader's batch, new over now
        resize = (f"divided by {1 / factor}" if factor.numerator == 1
                  else f"times {factor}")  # fmt: skip
        once.append(
            f"# and your DataLoader's batch_size {resize}: the same samples per optimizer "
            "step, in micro-batches the threshold can cut between"
        )
    return Adoption("lightning", spec, imports, tuple(once), ())


def sharded_adoption(spec: str, strategy: str, micro_batches: int | None) -> Adoption:
    """``ShardedStep``'s lines in an FSDP2 job (docs/sharded.md): the step owns each
    step's micro-batches, the reduction across replica groups and the optimizer's step."""
    deal = ", micro_batches=M" if strategy == "rebalance" else ""
    once = (
        f'step = ShardedStep(model, optimizer, "{spec}", mesh=mesh{deal})  '
        '# after fully_shard(model, mesh=mesh["shard"]) and the optimizer',
    )
    each = "each step"
    if "deal=demand" in spec:  # the step deals stream positions: integrate.sharded
        each += (
            " (micro_batches: this rank's stream by position, micro_batches[i] the same on "
            "every group's rank of this shard; the step takes what its group asks for)"
        )
    elif strategy == "rebalance":
        each += " (step.wants micro-batches: this rank's group's share)"
    elif strategy == "local-sgd":  # a call is H local steps: the forecast's unit (Rounds.plan)
        period = re.search(r"period=(\d+)", spec)
        h = period.group(1) if period else "H"
        m, each_m = ("M", "M") if micro_batches is None else (micro_batches, f"M={micro_batches}")
        each = (
            f"each call (H={h} local steps of {each_m} micro-batches each: give it {h} x {m} "
            "micro-batches, then the groups' models are averaged)"
        )
    elif micro_batches is not None:
        each += f" (its batch split in M={micro_batches} micro-batches)"
    return Adoption(
        "fsdp",
        spec,
        ("from tailtrain import ShardedStep",),
        once,
        ("step(micro_batches, lambda batch: loss_fn(model, batch))",),
        each=each,
    )


def check_setup(setup: str) -> str:
    if setup not in SETUPS:
        raise UsageError(f"--for {setup!r}: use one of {', '.join(SETUPS)}")
    return setup


def runnable(strategy: str, setup: str, spec: str | None = None) -> bool:
    """Whether a ``setup`` job can run ``spec`` (default: ``strategy``, a row's strategy
    family): whether one of the entries it adopts a rule with runs it (:data:`SETUPS`)."""
    entries = SETUPS[check_setup(setup)]
    if entries is None:
        return True
    from tailtrain.strategies.registry import parse_strategy  # every rule: only when asked

    try:
        rule = parse_strategy(strategy if spec is None else spec)
    except UsageError:  # a family alone that needs a parameter (k-sync): none to ask about
        return False
    return any(entry.refusal(rule) is None for entry in entries)


def adoption(
    spec: str,
    strategy: str,
    setup: str,
    micro_batches: int | None = None,
    shares: tuple[int, ...] | None = None,
    accumulation: int = 1,
    dealt: tuple[int, ...] | None = None,
) -> Adoption:
    """The lines that make a ``setup`` job run ``spec`` (of family ``strategy``), at
    ``micro_batches`` per step where it needs more than the job has, with ``shares`` where
    rebalance deals per-rank batches (a DDP job's; ``advice.units``); ``accumulation``: the
    loader batches a step of the job accumulates now; ``dealt``: the unequal per-rank batches
    the job already deals (a remedy adopted before), which sync, the job as measured, keeps."""
    if not runnable(strategy, setup, spec):
        raise UsageError(f"a {setup} job cannot run {spec!r}; advise --for {setup} never picks it")
    if strategy == "sync" and dealt is not None and setup != "tailtrain-train":
        # sync's row is the job as it runs: its shares, not a Trainer's or a loop's plain sync
        keep = f"# keep your job as it is: it deals its shares {list(dealt)}, which no row beats"
        return Adoption(setup, spec, (), (keep,), ())
    if setup == "hf":  # the Trainer subclass, or the DDP job's lines for a loop of one's own
        if strategy == "sync":
            keep = "# keep your Trainer as it is: sync is what it runs"
            return Adoption(setup, spec, (), (keep,), ())
        if strategy == "rebalance" and shares is not None:
            return hf_rebalance(spec, shares)
        moved = adoption(spec, strategy, "ddp", micro_batches, shares)
        return replace(moved, setup=setup, imports=(HF_MOVE, *moved.imports), edit_list=())
    if setup == "fsdp" and strategy != "sync":
        return sharded_adoption(spec, strategy, micro_batches)
    if setup == "lightning" and strategy != "sync":
        return lightning_adoption(spec, strategy, micro_batches, shares, accumulation)
    if strategy == "rebalance" and shares is not None and setup in ("ddp", "any"):
        return replace(ddp_rebalance(spec, shares), setup=setup)
    if setup in ("tailtrain-train", "any"):
        command = f'tailtrain train --strategy "{spec}"  # plus your run\'s other options'
        if micro_batches is not None:
            command = command.replace("  #", f" --micro-batches {micro_batches}  #")
        return Adoption(setup, spec, (), (), (), command)
    if strategy == "sync":
        return Adoption(setup, spec, (), ("# keep your loop as it is: sync is what it runs",), ())
    if setup == "ddp" and micro_batches is not None:
        return ddp_dropcompute(spec, micro_batches)
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
                "if not state.last.empty:  # no rank's gradient entered: no update",
                "    optimizer.step()",
                "optimizer.zero_grad()",
            ),
        )
    if "deal=demand" in spec:  # the step deals positions of the job's stream: integrate.demand
        return Adoption(
            setup,
            spec,
            ("from tailtrain import StragglerStep",),
            (f'step = StragglerStep(model, optimizer, "{spec}", micro_batches=M)',),
            ("step(stream, lambda batch: loss_fn(model, batch))",),
            each=(
                "each step (stream: the job's micro-batches by position, stream[i] the same "
                "on every rank, e.g. a map-style dataset of micro-batches; the step takes what "
                "this rank asks for; step.close() on every rank after the last step)"
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
