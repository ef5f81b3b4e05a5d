"""Compute times from a measured trace: replayed per worker, or resampled pooled.

The CSV has a header row with columns ``iteration,worker[,micro_batch][,censored],seconds``
``[,noncompute][,samples][,run]`` (any order; :data:`TRACE_FORMAT`). Each row is one unit of
work: one micro-batch when the ``micro_batch`` column is present, otherwise one worker's whole
iteration. ``samples`` counts the samples the worker computed in that unit (under DropCompute
the cut micro-batches are never computed, so it is also what entered the update); a probe
writes it, so ``advise`` can price a job in samples per second. ``run`` numbers the runs kept
in one file (a probe that finds an earlier run's trace appends with the next number, its
iterations counted from 0 again): everything that replays a trace reads one run, the last
unless ``run=K`` names another (:func:`read_run`), and ``advise`` compares the runs.
A row with ``censored=1`` was cut by a threshold: its seconds is a lower bound, and
the row is completed from the law fitted with censoring before anything else reads the trace
(``delays.censored``).

``trace:path=FILE`` (``sampling=per-worker``, the default) replays each worker's own times,
deterministically: worker w's j-th unit takes trace worker w's j-th recorded unit, in the
trace's order (by iteration, then micro_batch; rows that tie keep the file's order), cycling
when it runs out. With a ``micro_batch`` column, iteration j of worker w uses the micro-batch
times of w's j-th recorded iteration (cycling within it if the scenario asks for more
micro-batches than it recorded, the first ones if fewer). Trace workers are taken in id order:
with more scenario workers than trace workers W, worker w replays trace worker w mod W; with
fewer, the first N trace workers are used. A slow worker thus stays slow, as it was measured.

``trace:path=FILE,sampling=pooled`` draws rows with replacement from all workers together (a
bootstrap), which forgets who was slow. :func:`trace_notes` flags when that matters: the trace
shows *persistent per-worker differences* when a Kruskal–Wallis test of the workers' seconds
rejects equal distributions at level ``PERSISTENCE_LEVEL`` (0.001) and the per-worker medians
span at least ``PERSISTENCE_EFFECT`` (a quarter) of the pooled interquartile range, so a large
trace with negligible differences is not flagged.

Recorded communication: a trace that ``tailtrain train`` wrote has a ``noncompute`` column:
on the rows of a round's last iteration, the round's wall seconds less that worker's unit
seconds (its wait, communication and the runtime's overhead), NaN elsewhere; the
partial-collective and parameter-server topologies, whose ranks do not end their steps
together, write each job's step less its seconds (``runtime.telemetry``). A round's
replayed T^c is the smallest of them over the workers, the slowest worker's, so that the
replayed round, max_n (sum of n's units) + T^c, is the round's wall seconds.
``trace:path=FILE,of=noncompute`` is the law of those T^c (one value per recorded round,
bootstrapped: ``sample`` draws them with replacement); :func:`replayed_comm` makes it the
``--comm-time`` of ``simulate``, ``predict`` and ``advise`` when none is given, and
:func:`comm_note` says which they used. Traces without the column read as before.

A real computation's measured seconds cannot be stopped: under DropCompute's ``stop=preempt``
its unit in flight at tau runs to its end, uncounted (``cuttable`` False;
``sim.allreduce.timing``, and ``train`` sleeps such a unit whole). ``cut=no`` says a trace's
units were that, ``cut=yes`` that they were sleeps a threshold can cut. Without ``cut=``, the
trace's run row in ``machine.jsonl`` decides: a probe's says ``cut: false`` (a user's step);
``train``'s reads as a computation unless at least half its unit seconds were injected
sleeps (``asleep``) that could be cut; a trace with no row keeps the simulator's sleeps
(:func:`cuttable_units`).

Either way, the model's law is the empirical distribution of ``seconds``: ``sample`` draws
rows with replacement, cdf is the ECDF, mean and var are those of the empirical distribution,
and ``exact`` is False. Theory that treats draws as i.i.d. uses that law; a per-worker replay
is not i.i.d. across workers, so ``per_worker`` is True and callers must use ``draw_block``.
"""

from __future__ import annotations

import csv
import warnings
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from tailtrain.core.machine import read_machine
from tailtrain.delays.atomic import AtomicDelay
from tailtrain.delays.base import FloatArray, Shape
from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec

REQUIRED = ("iteration", "worker", "seconds")
OPTIONAL = ("micro_batch", "censored", "noncompute", "samples", "run")
#: the columns as error messages and help texts name them (module docstring)
TRACE_FORMAT = "iteration,worker[,micro_batch][,censored],seconds[,noncompute][,samples][,run]"
#: ``of=``: the units' seconds, or each recorded round's T^c (module docstring)
PARTS = ("seconds", "noncompute")
SAMPLING = ("per-worker", "pooled")
PERSISTENCE_LEVEL = 1e-3  #: Kruskal–Wallis level for persistent per-worker differences
PERSISTENCE_EFFECT = 0.25  #: least span of per-worker medians, in pooled IQRs
#: the least share of a run's unit seconds in injected sleeps that reads its units as sleeps
MOSTLY_ASLEEP = 0.5


@dataclass(frozen=True)
class Trace:
    """The columns of a trace file, one entry per row."""

    iteration: np.ndarray
    worker: np.ndarray
    micro_batch: np.ndarray | None
    seconds: FloatArray
    censored: np.ndarray | None = None  # True: seconds is a lower bound (``delays.censored``)
    #: recorded wait, communication and overhead (NaN: no round ends on that row); None:
    #: the trace has no such column
    noncompute: FloatArray | None = None
    #: samples computed in the row's unit; None: the trace has no such column
    samples: np.ndarray | None = None
    #: which run of the file the row belongs to; None: the file holds one run
    run: np.ndarray | None = None

    @property
    def runs(self) -> list[int]:
        """The run numbers the file holds, in order (``[0]`` without a ``run`` column)."""
        return [0] if self.run is None else [int(r) for r in np.unique(self.run)]

    def of_run(self, run: int) -> Trace:
        """The rows of one run (the trace itself when it has no ``run`` column)."""
        if self.run is None:
            return self
        keep = self.run == run
        if not keep.any():
            raise UsageError(f"the trace holds runs {self.runs}, not run {run}")
        return self.where(keep)

    def where(self, keep: np.ndarray) -> Trace:
        """The rows where ``keep`` (a boolean mask over the rows) is true, every column kept."""
        columns = {f.name: getattr(self, f.name) for f in fields(self)}
        return Trace(**{k: None if v is None else v[keep] for k, v in columns.items()})

    def round_comm(self) -> FloatArray:
        """Each recorded round's T^c, in iteration order: the smallest ``noncompute`` over
        the workers of an iteration that has one (module docstring); empty without any."""
        if self.noncompute is None:
            return np.empty(0)
        known = ~np.isnan(self.noncompute)
        iterations, slot = np.unique(self.iteration[known], return_inverse=True)
        least = np.full(iterations.size, np.inf)
        np.minimum.at(least, slot, self.noncompute[known])
        return least


@dataclass(frozen=True)
class Replay:
    """Each trace worker's units in replay order, padded into one table.

    ``seconds[w, j, c]`` is unit c of the j-th recorded iteration of the w-th trace worker (in
    id order); ``lengths[w]`` counts w's recorded iterations, ``counts[w, j]`` their units.
    Without a ``micro_batch`` column every row is its own iteration of one unit.
    """

    ids: np.ndarray
    seconds: FloatArray
    lengths: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, trace: Trace) -> Replay:
        rows = np.arange(trace.seconds.size)
        within = rows if trace.micro_batch is None else trace.micro_batch
        order = np.lexsort((rows, within, trace.iteration, trace.worker))
        ids, slot = np.unique(trace.worker[order], return_inverse=True)
        new = np.ones(rows.size, dtype=bool)  # a row that opens a recorded iteration
        if trace.micro_batch is not None:
            iteration = trace.iteration[order]
            new[1:] = (slot[1:] != slot[:-1]) | (iteration[1:] != iteration[:-1])
        group = np.cumsum(new) - 1
        group_slot = slot[new]  # sorted, as rows are sorted by worker
        lengths = np.bincount(group_slot, minlength=ids.size)
        index = np.arange(group_slot.size) - np.searchsorted(group_slot, group_slot)
        unit = rows - np.flatnonzero(new)[group]
        sizes = np.bincount(group)
        seconds = np.zeros((ids.size, lengths.max(), sizes.max()))
        seconds[slot, index[group], unit] = trace.seconds[order]
        counts = np.ones((ids.size, lengths.max()), dtype=np.int64)
        counts[group_slot, index] = sizes
        return cls(ids, seconds, lengths, counts)

    def block(self, start: int, shape: tuple[int, int, int]) -> FloatArray:
        """Durations (I, N, M) of iterations ``start..start+I-1``: worker n replays trace
        worker n mod W, its iteration j mod (its length), micro-batch m mod (units there)."""
        iterations, workers, micro_batches = shape
        slot = np.arange(workers) % self.ids.size
        j = np.arange(start, start + iterations)[:, None] % self.lengths[slot]
        unit = np.arange(micro_batches) % self.counts[slot, j][:, :, None]
        return self.seconds[slot[None, :, None], j[:, :, None], unit]


class TraceDelay(AtomicDelay):
    """A measured trace: replayed per worker by ``draw_block`` (unless ``sampling`` is
    ``pooled``); ``sample`` bootstraps its empirical law (so ``exact`` is False)."""

    def __init__(
        self,
        spec: str,
        trace: Trace,
        sampling: str = "per-worker",
        cores: int | None = None,
        cuttable: bool = True,
    ) -> None:
        #: a one-line note when rows were censored and completed from a fitted law, or None
        self.censoring: str | None = None
        if trace.censored is not None:
            # here, not at the top: the estimator and scipy load only for a censored trace (a
            # rank writes traces through this module and would pay a second at each start)
            from tailtrain.delays.censored import complete

            seconds, self.censoring = complete(
                spec, trace.worker, trace.seconds, trace.censored,
                iteration=trace.iteration, micro_batch=trace.micro_batch, cores=cores,
            )  # fmt: skip
            trace = replace(trace, seconds=seconds, censored=None)
        super().__init__(spec, trace.seconds, 1.0)
        self.trace = trace
        self.sampling = sampling
        self.per_micro_batch = trace.micro_batch is not None
        self._cuttable = cuttable

    @property
    def exact(self) -> bool:
        return False

    @property
    def cuttable(self) -> bool:
        return self._cuttable

    @property
    def per_worker(self) -> bool:
        return self.sampling == "per-worker"

    @cached_property
    def replay(self) -> Replay:
        return Replay.of(self.trace)

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        return self.trace.seconds[rng.integers(0, self.trace.seconds.size, size=shape)]

    def draw_block(
        self, rng: np.random.Generator, start: int, shape: tuple[int, int, int]
    ) -> FloatArray:
        if not self.per_worker:
            return self.sample(rng, shape)
        return self.replay.block(start, shape)

    def mapping(self, workers: int) -> str | None:
        """How ``workers`` scenario workers map onto the trace's, when the counts differ."""
        count = self.replay.ids.size
        order = "" if np.array_equal(self.replay.ids, np.arange(count)) else " (in id order)"
        if workers > count:
            return (
                f"trace {self.spec!r} has {count} workers for {workers}: worker w replays "
                f"trace worker w mod {count}{order}"
            )
        if workers < count:
            return (
                f"trace {self.spec!r} has {count} workers for {workers}: the first {workers} "
                f"trace workers{order} are replayed"
            )
        return None

    @cached_property
    def persistent_differences(self) -> str | None:
        """Why the workers differ persistently (see the module docstring), or None."""
        if self.replay.ids.size < 2 or np.ptp(self.trace.seconds) == 0:
            return None  # nothing to compare (and Kruskal-Wallis refuses all-equal values)
        slot = np.searchsorted(self.replay.ids, self.trace.worker)
        order = np.argsort(slot, kind="stable")
        groups = np.split(self.trace.seconds[order], np.cumsum(np.bincount(slot))[:-1])
        from scipy import stats  # here, not at the top: see ``__init__``'s censored branch

        p_value = float(stats.kruskal(*groups).pvalue)
        medians = np.array([np.median(g) for g in groups])
        spread = float(np.ptp(medians))
        iqr = float(np.subtract(*np.percentile(self.trace.seconds, [75, 25])))
        if p_value >= PERSISTENCE_LEVEL or spread <= 0 or spread < PERSISTENCE_EFFECT * iqr:
            return None
        slowest = int(self.replay.ids[np.argmax(medians)])
        return (
            f"trace {self.spec!r} has persistent per-worker differences (Kruskal-Wallis "
            f"p={p_value:.2g}; worker medians {medians.min():.4g}..{medians.max():.4g} s, "
            f"slowest worker {slowest}) but sampling=pooled forgets who was slow; "
            f"drop sampling=pooled to replay each worker"
        )


def read_trace(path: str | Path) -> Trace:
    """Read and check a trace CSV; every problem is a one-line :class:`UsageError`."""
    path = Path(path)
    header = _read_header(path)
    columns = _check_columns(path, header)
    table = _read_numbers(path, len(header))
    _check_values(path, table, columns)
    column = {name: table[:, index] for name, index in columns.items()}
    return Trace(
        iteration=column["iteration"].astype(np.int64),
        worker=column["worker"].astype(np.int64),
        micro_batch=column["micro_batch"].astype(np.int64) if "micro_batch" in column else None,
        seconds=np.ascontiguousarray(column["seconds"]),
        censored=column["censored"] > 0 if "censored" in column else None,
        noncompute=column.get("noncompute"),
        samples=column["samples"].astype(np.int64) if "samples" in column else None,
        run=column["run"].astype(np.int64) if "run" in column else None,
    )


def read_run(path: str | Path, run: int | None = None) -> Trace:
    """One run of the trace at ``path``: ``run``, or the last the file holds."""
    found = read_trace(path)
    return found.of_run(found.runs[-1] if run is None else run)


def _read_header(path: Path) -> list[str]:
    try:
        with path.open(newline="") as handle:
            first = next(csv.reader(handle), None)
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise UsageError(f"cannot read trace file {str(path)!r}: {reason}") from None
    if not first:
        raise UsageError(f"trace file {str(path)!r} is empty: expected a header row {TRACE_FORMAT}")
    return [name.strip() for name in first]


def _check_columns(path: Path, header: list[str]) -> dict[str, int]:
    unknown = [name for name in header if name not in REQUIRED + OPTIONAL]
    missing = [name for name in REQUIRED if name not in header]
    repeated = {name for name in header if header.count(name) > 1}
    for problem, names in (("unknown", unknown), ("missing", missing), ("repeated", repeated)):
        if names:
            raise UsageError(
                f"trace file {str(path)!r} has {problem} column(s) "
                f"{', '.join(sorted(names))}; expected columns {TRACE_FORMAT}"
            )
    return {name: header.index(name) for name in header}


def _read_numbers(path: Path, width: int) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "no data" is reported below
            table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64)
    except ValueError:
        raise UsageError(_first_bad_row(path, width)) from None
    if table.shape[0] == 0:
        raise UsageError(f"trace file {str(path)!r} has a header but no rows")
    return table


def _first_bad_row(path: Path, width: int) -> str:
    """Find the row numpy rejected, to name it (only runs when the file is bad)."""
    with path.open(newline="", errors="replace") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            if line == 1 or not row:
                continue
            if len(row) != width:
                return (
                    f"trace file {str(path)!r} line {line} has {len(row)} fields; "
                    f"the header has {width}"
                )
            for field in row:
                try:
                    float(field)
                except ValueError:
                    return (
                        f"trace file {str(path)!r} line {line}: {field.strip()!r} is not a number"
                    )
    return f"trace file {str(path)!r} is not a numeric CSV"


def _check_values(path: Path, table: np.ndarray, columns: dict[str, int]) -> None:
    for name, index in columns.items():
        values = table[:, index]
        bad = ~np.isfinite(values) | (values < 0)
        if name == "noncompute":  # NaN: no round ends on this row
            bad &= ~np.isnan(values)
        elif name != "seconds":
            bad |= values != np.floor(values)
        if name == "censored":
            bad |= values > 1
        if bad.any():
            row = int(np.argmax(bad))
            kind = "an integer >= 0"
            kind = "a finite number >= 0" if name == "seconds" else kind
            kind = "a finite number >= 0 or nan" if name == "noncompute" else kind
            kind = "0 or 1" if name == "censored" else kind
            raise UsageError(
                f"trace file {str(path)!r} data row {row + 1}: {name}="
                f"{values[row]:g} must be {kind}"
            )


def write_trace_rows(
    path: str | Path,
    table: np.ndarray,
    per_micro_batch: bool,
    append: bool = False,
    censored: bool = False,
    noncompute: bool = False,
    samples: bool = False,
    run: bool = False,
) -> None:
    """Write rows [iteration, worker, (micro_batch,) (censored,) seconds(, noncompute)
    (, samples)(, run)] in the format :func:`read_trace` reads, sorted by iteration, worker and
    micro-batch; ``append`` adds them to a file this wrote (the header only when the file is
    new): a probe writes its trace a window at a time, and the reader takes rows in any order;
    ``censored``: the column before seconds is the censoring flag; ``noncompute``: the
    recorded wait, communication and overhead follows seconds; ``samples`` and ``run``: the
    samples computed and the run number come last."""
    path = Path(path)
    header = [*REQUIRED[:2], *(OPTIONAL[:1] if per_micro_batch else ())]
    header += ["censored"] * censored + ["seconds"] + ["noncompute"] * noncompute
    header += ["samples"] * samples + ["run"] * run
    floats = {header.index("seconds"), *([header.index("noncompute")] if noncompute else [])}
    keys = 2 + per_micro_batch
    order = np.lexsort(table[:, :keys].T[::-1]) if len(table) else np.arange(0)
    fresh = not append or not path.exists() or path.stat().st_size == 0
    with path.open("w" if fresh else "a", newline="") as handle:
        writer = csv.writer(handle)
        if fresh:
            writer.writerow(header)
        for row in table[order]:
            writer.writerow([repr(float(v)) if i in floats else int(v) for i, v in enumerate(row)])


def trace(spec: Spec) -> TraceDelay:
    """``trace:path=FILE[,sampling=per-worker|pooled][,of=seconds|noncompute][,run=K]
    [,cores=C][,cut=yes|no]``: replay or bootstrap FILE's seconds, or (``of=noncompute``)
    bootstrap its rounds' recorded T^c, of run K (default: the file's last run). ``cores``:
    the cores its ranks shared (default: ``machine.jsonl`` beside FILE; see
    :func:`shared_cores`); ``cut``: whether a threshold can stop a unit in flight
    (:func:`cuttable_units`)."""
    spec.require_known(("path", "sampling", "of", "run", "cores", "cut"))
    sampling = spec.get_str("sampling", SAMPLING[0])
    if sampling not in SAMPLING:
        raise UsageError(
            f"{spec.text!r}: unknown sampling={sampling!r}; use sampling=per-worker "
            f"(replay each worker's times, the default) or sampling=pooled (bootstrap)"
        )
    part = spec.get_str("of", PARTS[0])
    if part not in PARTS:
        raise UsageError(
            f"{spec.text!r}: unknown of={part!r}; use of=seconds (the units' times, the "
            "default) or of=noncompute (each recorded round's wait, communication and overhead)"
        )
    found = read_run(spec.get_str("path"), _run_of(spec))
    cuttable = cuttable_units(spec, found)
    if part == "seconds":
        return TraceDelay(spec.text, found, sampling, shared_cores(spec, found), cuttable)
    comm = found.round_comm()
    if comm.size == 0:
        raise UsageError(
            f"{spec.text!r}: the trace records no noncompute seconds; record them with "
            "`tailtrain train --out DIR` or drop of=noncompute"
        )
    rounds = np.arange(comm.size)
    return TraceDelay(spec.text, Trace(rounds, np.zeros_like(rounds), None, comm), "pooled")


def replayed_comm(delay: str, comm_time: str | None) -> str | None:
    """The ``--comm-time`` a replay of ``delay`` charges: ``comm_time`` when given, else the
    recorded rounds' T^c (``of=noncompute``) when ``delay`` is a trace that has them, else
    None (no communication)."""
    if comm_time is not None or not _is_trace(delay):
        return comm_time
    spec = parse_spec(delay)
    path, run = spec.get_str("path"), _run_of(spec)
    if not read_run(path, run).round_comm().size:
        return None
    return f"trace:path={path},of=noncompute" + ("" if run is None else f",run={run}")


def comm_note(delay: str, comm_time: str | None) -> str | None:
    """Which T^c a replay of ``delay`` with ``--comm-time`` ``comm_time`` charges, in one
    sentence; None when ``delay`` is no trace or one that recorded no noncompute seconds
    (nothing to choose from: ``--comm-time`` or none, as before such traces existed)."""
    if not _is_trace(delay):
        return None
    spec = parse_spec(delay)
    recorded = read_run(spec.get_str("path"), _run_of(spec)).round_comm()
    if recorded.size == 0:
        return None
    if comm_time is not None and ",of=noncompute" in comm_time:
        return (
            f"T^c replayed from the trace: its {recorded.size} rounds' recorded wait, "
            f"communication and overhead (mean {recorded.mean():.4g} s per round; "
            "--comm-time overrides it)"
        )
    return f"T^c from --comm-time {comm_time} in place of the trace's recorded noncompute"


def shared_cores(spec: Spec, found: Trace) -> int | None:
    """The cores the trace's ranks shared when fewer than its workers, else None: ``cores=C``,
    or the trace's run row in ``machine.jsonl`` beside it when that host ran all the trace's
    workers (on several hosts the others are not seen) and its units were not mostly
    injected sleeps (:func:`mostly_asleep`: a sleep holds no core; ``core.machine``)."""
    workers = np.unique(found.worker).size
    if spec.has("cores"):
        cores = spec.get_int("cores", minimum=1)
    else:
        row = read_machine(Path(spec.get_str("path")).parent, found.runs[-1])
        if row is None or int(row.get("local_ranks", 1)) != workers:
            return None
        if mostly_asleep(row):
            return None
        cores = max(int(row.get("cores", workers)), 1)
    return cores if cores < workers else None


def cuttable_units(spec: Spec, found: Trace) -> bool:
    """Whether a threshold can stop the trace's units in flight: ``cut=yes|no``; else the
    trace's run row in ``machine.jsonl`` beside it: no when it says ``cut: false`` (a probe,
    or a ``train`` run of units that could not be cut), else yes iff at least half its unit
    seconds were injected sleeps (``asleep``); yes without a row or an ``asleep``, as the
    simulator's sleeps (module docstring)."""
    if spec.has("cut"):
        cut = spec.get_str("cut")
        if cut not in ("yes", "no"):
            raise UsageError(
                f"{spec.text!r}: cut={cut!r}; use cut=yes (the units were sleeps a threshold "
                "can stop) or cut=no (a computation's, which runs to its end)"
            )
        return cut == "yes"
    row = read_machine(Path(spec.get_str("path")).parent, found.runs[-1])
    if row is None:  # nothing says what the units were
        return True
    if row.get("cut") is False:  # the run said so (a probe, or uncuttable injected units)
        return False
    return "asleep" not in row or mostly_asleep(row)


def cut_option(path: str | Path, found: Trace) -> str:
    """``,cut=no`` when the trace at ``path`` (read as ``found``) is of units a threshold
    cannot cut, else "": for a trace written again elsewhere (a block, a split, groups), whose
    new folder has no ``machine.jsonl`` to say so."""
    return cut_flag(cuttable_units(parse_spec(f"trace:path={path}"), found))


def cut_flag(cuttable: bool) -> str:
    """The ``trace:`` option that says units are ``cuttable``: "" (the default without a
    machine row) or ``,cut=no``."""
    return "" if cuttable else ",cut=no"


def mostly_asleep(row: dict) -> bool:
    """Whether a machine row says at least half its units' seconds were injected sleeps: a
    sleep holds no core and a threshold can cut it, so the units are read as sleeps."""
    return float(row.get("asleep", 0.0)) >= MOSTLY_ASLEEP


def _run_of(spec: Spec) -> int | None:
    """``run=K`` of a trace spec, or None (the file's last run)."""
    return spec.get_int("run", minimum=0) if spec.has("run") else None


def _is_trace(delay: str) -> bool:
    """A lone ``trace:`` spec (not a sum with another model)."""
    return delay.startswith("trace:") and "+" not in delay
