"""The face's functions: one signature per entry, a strategy as a spec string or an object.

Each is a thin wrapper over the internal entry point it names; the internals are reached
through the package's one table of import paths (``tailtrain._INTERNAL``), so this module
names no internal module. Use them as ``tailtrain.simulate`` and so on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tailtrain
from tailtrain import _internal
from tailtrain.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from tailtrain import (
        Advice,
        Comparison,
        Prediction,
        RunControl,
        RunRecord,
        Scenario,
        Strategy,
    )

#: TrainConfig fields that ``train`` sets itself or that the launcher owns
_TRAIN_OWN = ("scenario", "strategy", "seed", "inject", "backend", "timeout", "out", "report")


def strategy(spec: str | Strategy) -> Strategy:
    """A strategy from its spec, e.g. ``"dbw"``, ``"k-sync:k=8"``,
    ``"dropcompute:threshold=auto"``; a [`Strategy`][tailtrain.Strategy] comes back unchanged.

    Args:
        spec: a strategy spec (the command-line reference's "Specs") or a strategy object.

    Returns:
        The strategy: its rule (``init``, ``plan``, ``select``, ``adapt``) and its topology.

    Raises:
        UsageError: an unknown strategy or parameter, or neither a string nor a strategy.
    """
    return _rule(spec)


def simulate(
    scenario: Scenario,
    strategy: str | Strategy,
    *,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
    control: RunControl | None = None,
    task: Any = None,
    delays: Any = None,
) -> RunRecord:
    """Run ``strategy`` on ``scenario`` on the virtual clock; the same inputs give the same
    record.

    Args:
        scenario: the run: task, workers, delays, and iterations or a time budget.
        strategy: a spec string or a strategy object.
        seed: seeds the task's data, the model, the delays and the rule.
        progress: called with (updates applied, virtual time) after each update.
        control: a [`RunControl`][tailtrain.RunControl]: stream the record to a folder,
            checkpoint, resume, drill faults.
        task: replaces the scenario's task (tests, own models).
        delays: replaces the scenario's delay process.

    Returns:
        The run record: ``steps``, ``evals`` and the ``summary`` (final loss, mean k, ...).

    A ``trace:`` delay that recorded its rounds' ``noncompute`` seconds (``tailtrain train``'s
    ``trace.csv``) is charged them as T^c unless ``scenario.comm_time`` is set, as
    ``tailtrain simulate`` does (``Scenario.with_replayed_comm``).
    """
    run = _internal("simulate")
    rule = _rule(strategy)
    if delays is None:  # the scenario's own delay: its trace's T^c, as the CLI charges it
        scenario = scenario.with_replayed_comm()
    return run(scenario, rule, seed, progress, task=task, delays=delays, control=control)


def compare(
    scenario: Scenario,
    strategies: str | Sequence[str | Strategy],
    *,
    seeds: Sequence[int] = (0,),
    on_run: Callable[[str, int], Callable[[int, float], None] | None] | None = None,
    on_done: Callable[[str, int, RunRecord], None] | None = None,
) -> Comparison:
    """Simulate every strategy on every seed, all on the same sampled delays (common random
    numbers: worker w's j-th job lasts as long under every strategy).

    Args:
        scenario: the run, as for [`simulate`][tailtrain.simulate].
        strategies: specs and strategy objects, or one comma-separated string
            (``"sync,k-sync:k=8,dbw"``).
        seeds: each strategy runs once per seed.
        on_run: given (strategy, seed) before a run, returns its progress callback or None.
        on_done: sees (strategy, seed, record) as each run finishes.

    Returns:
        The runs by strategy; ``rows()`` gives the mean and spread of each over the seeds.

    T^c as [`simulate`][tailtrain.simulate] resolves it (a trace's recorded noncompute
    seconds unless ``scenario.comm_time`` is set).
    """
    scenario = scenario.with_replayed_comm()
    if isinstance(strategies, str):
        rules = _internal("parse_strategies")(strategies)
    else:
        rules = [_rule(s) for s in strategies]
    if not rules:
        raise UsageError("compare needs at least one strategy")
    return _internal("compare")(scenario, rules, list(seeds), on_run, on_done)


def predict(
    scenario: Scenario,
    strategy: str | Strategy | None = None,
    *,
    ks: Sequence[int] | None = None,
    samples: int = 2000,
    seed: int = 0,
) -> Prediction:
    """Expected iteration time and speedup over sync, from theory, for ``scenario``'s
    workers, delay, pattern, micro-batches and communication time (its task is not used).

    Closed forms where they are exact (sync and K-sync order statistics, DropCompute's
    Eq. (6) for its threshold), numerical integration or a seeded Monte Carlo where the papers
    only bound or approximate; each row names its method. Rows are ranked by the effective
    speedup, K E[T_sync] / (N E[T_K]), which orders the error-runtime trade-off of Lemma 7 /
    Theorem 3 of Dutta et al. (``tailtrain.prediction``'s module docstring has the model).

    Args:
        scenario: the run; ``comm_time`` is T^c (``network`` is not modelled here); unset,
            a ``trace:`` delay's recorded noncompute seconds, as ``tailtrain predict``;
            ``group_size`` > 1: its ranks in replica groups, the rows of the groups.
        strategy: keep only this strategy's rows (for a K-family spec, its K and the best K);
            None: every strategy, as ``tailtrain predict`` prints.
        ks: the K values to list (default: every K up to N = 32, else a grid).
        samples: Monte Carlo iterations where no exact method exists.
        seed: the Monte Carlo seed.

    Returns:
        The rows (one per strategy and setting, the best marked) and notes.

    Raises:
        UsageError: the scenario cannot be predicted, or no row answers for ``strategy``.
    """
    rule = None if strategy is None else _rule(strategy)
    k = getattr(rule, "k", None) if rule is not None else None
    if isinstance(k, int) and ks is None:
        ks = (k,)
    # DropCompute's row at the tau asked for (``dropcompute:threshold=X``), not at its tau*
    tau = (
        getattr(rule, "threshold", None)
        if rule is not None and rule.name == "dropcompute"
        else None
    )
    question = _delay_scenario(scenario, ks, samples, seed, threshold=tau)
    found = _internal("with_families")(_internal("predict")(question))
    if rule is None:
        return found
    return _rows_of(found, rule)


def train(
    scenario: Scenario,
    strategy: str | Strategy,
    *,
    seed: int = 0,
    backend: str = "gloo",
    out: str | Path | None = None,
    inject: bool = False,
    timeout: float = 300.0,
    endpoint: str = "127.0.0.1:0",
    overwrite: bool = False,
    **options: Any,
) -> RunRecord:
    """Train ``strategy`` on ``scenario`` with real processes (torch.distributed), as
    [`simulate`][tailtrain.simulate] runs it on the virtual clock: ``scenario.workers`` local
    ranks (plus a server rank for a parameter-server strategy), or this rank of a ``torchrun``
    job.

    Args:
        scenario: the run, as for [`simulate`][tailtrain.simulate]; its task must have a model.
        strategy: a spec string or a strategy object.
        seed: every rank rebuilds its task, data, delays and rule from it.
        backend: ``gloo`` (CPU) or ``nccl`` (one GPU per rank).
        out: the run folder: rank 0's record, per-rank traces and checkpoints.
        inject: add ``scenario.delay``/``pattern`` as injected seconds per unit of work
            (False: the work takes its real time).
        timeout: seconds that bound every collective and the rendezvous.
        endpoint: ``HOST:PORT`` of the local rendezvous (port 0: a free one).
        overwrite: replace the run ``out`` holds (else such a folder is refused; a local
            launch clears it once the input is checked). A run that ``tailtrain train
            --resume DIR`` can go on from is one the command line started (it reads the
            run's flags from run.json).
        **options: further ``TrainConfig`` fields: ``threads``, ``verbose``, ``faults``,
            ``on_nonfinite``, ``checkpoint_every``, ``max_restarts``, ``worker_timeout``,
            ``tensorboard``, ``progress``, ``device``.

    Returns:
        The job's run record, as ``simulate`` returns it: ``steps``, ``evals`` and the
        ``summary`` (``wall_time`` where simulate has ``virtual_time``), and ``theta``, the
        final parameters, flat. Every rank gets the same record: a local launch returns rank
        0's; under torchrun each rank's ``train`` returns rank 0's steps, evaluations and
        summary, which rank 0 broadcasts to the others as the run ends, and its own
        ``theta`` (None on a parameter server's worker ranks, which hold no model).

    Raises:
        UsageError: a bad argument, found before any process starts.

    Local ranks start from a fork server that imports the calling script again, so a script
    calls ``train`` under ``if __name__ == "__main__":``.
    """
    config_type = _internal("TrainConfig")
    known = [f.name for f in dataclasses.fields(config_type) if f.name not in _TRAIN_OWN]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(f"train() has no option {unknown[0]!r}; use one of {', '.join(known)}")
    config = config_type(
        scenario=scenario,
        strategy=_rule(strategy),
        seed=seed,
        inject=inject,
        backend=backend,
        timeout=timeout,
        out=None if out is None else Path(out),
        **options,
    )
    return _record_of(_internal("train")(config, endpoint, _claim(config.out, overwrite)))


def train_own_model(
    model: Callable[[], nn.Module],
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: Callable[[], tuple[torch.Tensor, ...]],
    *,
    strategy: str | Strategy = "dbw",
    workers: int = 4,
    batch_size: int = 32,
    lr: float = 0.1,
    iterations: int | None = None,
    time_budget: float | None = None,
    delay: str | None = None,
    pattern: str = "iid",
    seed: int = 0,
    timeout: float = 120.0,
    out: str | Path | None = None,
    endpoint: str = "127.0.0.1:0",
) -> RunRecord:
    """Train your own model with a parameter-server strategy (``dbw``, ``k-sync:k=K``,
    ``lgc:k=K``, ...) on a server and ``workers`` worker processes.

    ``model()`` builds the ``nn.Module`` (every rank calls it under the same seed, so every
    rank starts from the same parameters), ``loss(output, target)`` is the mean loss of a
    batch, and ``data()`` returns ``(x_train, y_train)`` or ``(x_train, y_train, x_test,
    y_test)`` tensors. Locally, callables your script defines at its top level start its
    ranks from a fork server, which re-runs the script's top level (call this under
    ``if __name__ == "__main__":``); lambdas and closures fork from your process. Under
    torchrun every rank runs your script and passes its own.

    Args:
        model: builds the ``nn.Module``; every rank calls it under the same seed.
        loss: ``loss(output, target)``, the mean loss of a batch.
        data: returns ``(x_train, y_train)`` or ``(x_train, y_train, x_test, y_test)``.
        strategy: a parameter-server strategy, as a spec string or a strategy object.
        workers: worker processes (the server is one more).
        batch_size: examples per job.
        lr: the learning rate.
        iterations: updates to apply (default 100 unless ``time_budget`` is given).
        time_budget: seconds to train instead.
        delay: a delay spec injected per job (None: jobs take their real time).
        pattern: the worker pattern of the injected delays.
        seed: seeds the model, the mini-batches and the delays.
        timeout: seconds that bound every wait.
        out: the run folder (the server's record and the traces); refused if it holds a run.
        endpoint: ``HOST:PORT`` of the local rendezvous.

    Returns:
        The job's run record, as [`train`][tailtrain.train] returns it on every rank:
        the server's steps, evaluations and summary, and ``theta``, the final parameters,
        flat, on the server (rank 0; None on a worker rank under torchrun).
        ``torch.nn.utils.vector_to_parameters(torch.as_tensor(record.theta),
        module.parameters())`` loads them into a module ``model()`` built.

    Raises:
        UsageError: a bad argument (a strategy that is not a parameter server's among them),
            found before any process starts.
    """
    result = _internal("train_own_model")(
        model,
        loss,
        data,
        strategy=_rule(strategy),
        workers=workers,
        batch_size=batch_size,
        lr=lr,
        iterations=iterations,
        time_budget=time_budget,
        delay=delay,
        pattern=pattern,
        seed=seed,
        timeout=timeout,
        out=out,
        endpoint=endpoint,
    )
    return _record_of(result)


def advise(
    trace: str | Path,
    *,
    workers: int | None = None,
    micro_batches: int | None = None,
    seed: int = 0,
    samples: int = 2000,
    setup: str = "any",
    comm_time: str | None = None,
    group_size: int = 1,
    group_cost: float = 0.0,
) -> Advice:
    """Who is slow in a measured trace, what sync loses waiting for them, and which strategy
    to run, as ``tailtrain advise FILE|DIR`` prints it.

    Args:
        trace: a CSV of ``iteration,worker[,micro_batch][,censored],seconds`` rows, or a
            folder holding one as ``trace.csv`` (a ``StragglerProbe``'s or a run's).
        workers: workers to advise for (default: the trace's); worker n replays trace
            worker n mod W.
        micro_batches: micro-batches per step (default: the trace's, if it has them).
        seed: seeds the Monte Carlo and the timing-only simulations.
        samples: Monte Carlo iterations where no exact method exists.
        setup: the job advised, ``ddp``, ``loop``, ``tailtrain-train`` or ``any``: only
            what it can run is ranked, and ``adopt`` holds the lines that adopt the pick.
        comm_time: T^c per round, seconds or a delay spec (``--comm-time``); default: the
            rounds' ``noncompute`` seconds the trace recorded (``delays.trace``), else 0.
        group_size: read the trace's ranks as replica groups of this many (a hybrid-sharded
            job, ``--group-size``): each group's unit is the max over its ranks plus
            ``group_cost`` seconds, and everything is advised at group level.
        group_cost: exposed within-group collectives per group unit, seconds.

    Returns:
        The advice: per-worker verdicts (``stragglers``), the ``cost`` of waiting, every
        strategy ``ranked`` and the ``recommendation`` with its ``reason``.
    """
    return _internal("advise")(
        trace,
        workers=workers,
        micro_batches=micro_batches,
        seed=seed,
        samples=samples,
        setup=setup,
        comm_time=comm_time,
        group_size=group_size,
        group_cost=group_cost,
    )


# ---- helpers ----------------------------------------------------------------------------------
def _rule(spec: Any) -> Strategy:
    """A strategy object from a spec or an object (what every entry does first)."""
    if isinstance(spec, str):
        return _internal("parse_strategy")(spec)
    if isinstance(spec, tailtrain.Strategy):
        return spec
    raise UsageError(
        f"strategy must be a spec such as 'dbw' or a Strategy, got {type(spec).__name__}"
    )


def _record_of(result: Any) -> RunRecord:
    """What a real run hands the user (a rank's ``RankResult``, which holds the job's record
    on every rank): its record, with this rank's final parameters (None where it has none)."""
    record = result.record
    record.theta = result.theta if result.theta.size else None
    return record


def _claim(out: Path | None, overwrite: bool) -> Callable[[], None] | None:
    """The run folder, created, as ``tailtrain train --out`` claims it: in a local launch,
    refused if it holds a run, unless ``overwrite``; then cleared once the input is checked.
    Under torchrun the ranks continue a run they find there (a restart), as the CLI's do."""
    if out is None:
        return None
    _internal("prepare_folder")(out)
    if _internal("in_torchrun")():
        return None
    names = (*_internal("RUN_FILES"), *_internal("TRAIN_EXTRA"))
    held = _internal("held_run")(out, names)
    if held and not overwrite:
        raise UsageError(
            f"out={str(out)!r} already holds a run ({held[0]}); give a new folder or overwrite=True"
        )
    return lambda: _internal("clear_run")(out, names)


def _delay_scenario(
    scenario: Scenario,
    ks: Sequence[int] | None,
    samples: int,
    seed: int,
    threshold: float | None = None,
) -> Any:
    """The run's delays as ``predict`` takes them: delay models instead of spec strings;
    ``threshold``: DropCompute's tau as asked (None: its tau*)."""
    scenario = scenario.with_replayed_comm()  # T^c resolved as simulate and the CLI do
    comm = _internal("parse_comm_time")(scenario.comm_time or "0")
    pattern = None if scenario.pattern == "iid" else _internal("parse_pattern")(scenario.pattern)
    return _internal("DelayScenario")(
        workers=scenario.workers,
        delay=_internal("parse_delay")(scenario.delay),
        pattern=pattern,
        micro_batches=scenario.micro_batches,
        comm=comm.mean if comm.var == 0 else comm,
        ks=None if ks is None else tuple(sorted(set(ks))),
        samples=samples,
        seed=seed,
        threshold=threshold,
        group_size=scenario.group_size,
        group_cost=scenario.group_cost,
    )


def _rows_of(found: Prediction, rule: Strategy) -> Prediction:
    """``found`` with only ``rule``'s rows (for a K-family rule: its K and the best K)."""
    k = getattr(rule, "k", None)
    exact = rule.name in _internal("K_FAMILY") and isinstance(k, int)
    rows = tuple(
        r for r in found.rows if r.strategy == rule.name and (not exact or r.k == k or r.best)
    )
    if not rows:
        have = sorted({r.strategy for r in found.rows})
        raise UsageError(
            f"predict has no row for {rule.describe()!r}; it predicts {', '.join(have)}"
        )
    return dataclasses.replace(found, rows=rows)
