"""The runtime (`tailtrain train`) against PyTorch's own loops, and against the simulator.

    python bench/bench_runtime.py            # human-readable lines
    python bench/bench_runtime.py --json     # one JSON object

* ``overhead``: wall time of the allreduce runtime running ``sync`` over a bare
  ``DistributedDataParallel`` loop, same task, ranks, steps and data, no injected delay
  (goal <= 1.03); each loop gathers its batch inside the step, as a loader would.
  ``added_ms_per_round`` is the difference per round, mostly the runtime's Python per round
  (planning, the rule's consultation, the clock, the screen and, a batch of rounds at a
  time, the statistics and record rows), whose numpy and torch calls run cold after each
  compute: 5-15 times their cost in a warm loop. DDP has Python of its own (its hooks, the
  optimizer's step) that the runtime's one flat gradient and one-pass update avoid. The task
  is digits-cnn at batch 256, a DDP step of 4-5 ms here (2 ranks on 2 cores), shorter than
  data-parallel steps run in practice; ``overhead_long_step`` repeats the measurement at
  batch 1024 (a 10-12 ms step) to show how the cost scales with the step: were it fixed, it
  would weigh a third as much.
  Both run in the same forked job after a warm-up, in pairs (each side first in every
  other pair); each side's time is the difference between a run ``--overhead-steps`` longer
  and a short one, so start-up, the first and last evaluations and process start cancel,
  leaving the loop itself.
  ``overhead`` is the median of the pairs' ratios, ``overhead_quartiles`` their spread and
  ``overhead_median_interval`` a 90% interval for the median: on a shared 2-core
  machine single pairs range from 0.8 to 1.3, so a few long runs and their minimum, as this
  bench measured before, moved by +-10% between identical runs. 60 pairs (``--overhead-pairs``)
  gave intervals 4-9% wide, 30 pairs 5-9%: as wide as what is measured.
* ``dropcompute_real_speedup`` / ``dropcompute_sim_speedup``: mean iteration time of ``sync``
  over ``dropcompute:threshold=auto`` (after its calibration rounds) with 8 ranks, M = 12 and
  injected ``const:value=0.02+dropcompute-noise:scale=0.02``, measured by ``train`` and
  predicted by ``simulate`` for the same flags and seed (goal: real >= 0.9 x simulated).
  A real round also computes and communicates, which the injected delays do not describe,
  so each ``simulate`` run is told what its real run measured over the same rounds:
  ``--comm-time const:value=T^c`` with T^c the mean ``comm_time`` of steps.jsonl, and
  ``+const:value=c`` on ``--delay`` with c the mean real (not injected) seconds per
  micro-batch (``rank_compute - rank_injected``). Like is compared with like; the predictions
  told T^c only, and nothing, stay in the detail (``sim_told_comm_only``, ``sim_told_nothing``).
* ``parity_iteration_time_error``: |real - simulated| / real mean iteration time of the same
  run (simulated with its measured T^c), the larger over those two runs (goal <= 5%).
* ``vs_post_local_sgd``: time to a target train loss of the best of tailtrain's candidates
  over PyTorch's ``PostLocalSGDOptimizer`` + ``post_localSGD_hook`` at its best period in
  {2, 4, 8}: same task, ranks, micro-batches, data stream and injected delays (the runtime's
  ``Injector``: the simulator's seeded delay process, slept), evaluation excluded from both
  clocks, the time interpolated between evaluations (``core.evaluation.time_to_target``) on
  the same grid for both sides: every ``PLS_EVAL_EVERY`` = 8 iterations, a whole number of
  rounds for every candidate (H <= 8). A finer grid on one side would favour it: the loss
  falls convexly, so a straight line over a longer interval crosses the target later. Each
  configuration's time is its median over ``--pls-repeats`` runs, both sides run in every
  repeat (single runs put the ratio anywhere from 0.90 to 1.01 on a loaded machine).

A shared, loaded machine skews every wall-clock figure here; the bench says how many CPUs it had.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from scipy.stats import binom
from torch.nn.parallel import DistributedDataParallel as DDP

from tailtrain.core.evaluation import time_to_target
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario
from tailtrain.runtime.allreduce.rounds import train_allreduce
from tailtrain.runtime.config import TrainConfig, build_world
from tailtrain.runtime.inject import Injector
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.reduce import Collectives
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks.stream import job_batches

SEED = 0
OVERHEAD_TASK = "digits-cnn:batch=256"
#: the same model at a step about three times as long: how the added cost scales with the step
LONG_STEP_TASK = "digits-cnn:batch=1024"
DC_DELAY = "const:value=0.02+dropcompute-noise:scale=0.02"
DC_STRATEGY = "dropcompute:threshold=auto,calibrate=10"
PLS_DELAY = "const:value=0.01+dropcompute-noise:scale=0.01"
PLS_PERIODS = (2, 4, 8)
PLS_LR, PLS_TARGET = 0.5, 0.7
#: iterations between evaluations, both sides: a multiple of every round length H
PLS_EVAL_EVERY = 8


# ---- running functions on forked ranks ------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, fn: Callable, size: int, port: int, folder: str, args: tuple) -> None:
    torch.set_num_threads(1)
    gc.freeze()
    dist.init_process_group(
        "gloo",
        f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=120),
    )
    result = fn(rank, size, *args)
    torch.save(result, Path(folder) / f"rank{rank}.pt")
    dist.destroy_process_group()


def on_ranks(fn: Callable, size: int, *args) -> list:
    """Every rank's return value of ``fn(rank, size, *args)`` in a forked gloo job."""
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            _rank, (fn, size, free_port(), folder, args), nprocs=size, start_method="fork"
        )
        return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False) for r in range(size)]


def mean_iteration(record: RunRecord, skip: int) -> float:
    """Mean seconds per round after the first ``skip`` rounds (from the cumulative times)."""
    times = np.concatenate([[0.0], record.column("time")])
    return float(np.diff(times)[skip:].mean())


# ---- 1. overhead: train's sync over bare DDP --------------------------------------------------
def ddp_loop(rank: int, config: TrainConfig) -> float:
    """A bare DDP loop on the same task, data stream and learning rate; its wall seconds."""
    world, _ = build_world(config)
    task, steps = world.task, config.scenario.iterations
    model = DDP(task.module_at(task.init_params(config.seed)))
    optimizer = torch.optim.SGD(model.parameters(), lr=world.lr)
    rounds = np.arange(steps)
    index = job_batches(world.partition, config.seed, task.batch_size, [rank] * steps, rounds)
    data = task.data
    dist.barrier()
    start = time.perf_counter()
    for batch in torch.from_numpy(index[:, 0]):  # each step gathers its batch, as a loader does
        optimizer.zero_grad()
        F.cross_entropy(model(data.x_train[batch]), data.y_train[batch]).backward()
        optimizer.step()
    dist.barrier()
    return time.perf_counter() - start


def train_loop(rank: int, config: TrainConfig) -> float:
    """``tailtrain train``'s rank entry on the same job; its wall seconds."""
    comm = Collectives(rank, dist.get_world_size(), torch.device("cpu"))
    dist.barrier()
    start = time.perf_counter()
    train_allreduce(config, comm)
    dist.barrier()
    return time.perf_counter() - start


def overhead_job(rank: int, size: int, task: str, short: int, long: int, pairs: int) -> list[dict]:
    def config(steps: int) -> TrainConfig:
        s = Scenario(task=task, workers=size, iterations=steps, eval_every=steps)
        return TrainConfig(scenario=s, strategy="sync", seed=SEED, timeout=120)

    ddp_loop(rank, config(short)), train_loop(rank, config(short))  # warm-up
    loops = (("ddp", ddp_loop), ("train", train_loop))
    rows = []
    for pair in range(pairs):
        seconds = {}
        for name, loop in loops if pair % 2 == 0 else loops[::-1]:  # each goes first as often
            seconds[name] = loop(rank, config(long)) - loop(rank, config(short))
        rows.append(seconds)
    return rows


def overhead(task: str, workers: int, short: int, long: int, pairs: int) -> dict:
    rows = on_ranks(overhead_job, workers, task, short, long, pairs)[0]
    ddp, train = (np.array([row[name] for row in rows]) for name in ("ddp", "train"))
    ratio, steps = train / ddp, long - short
    return {
        "overhead": float(np.median(ratio)),
        "overhead_detail": {
            "task": task,
            "workers": workers,
            "steps": steps,
            "pairs": pairs,
            # the spread of single pairs, and how well their median is known (90%)
            "overhead_quartiles": np.percentile(ratio, [25, 75]).tolist(),
            "overhead_median_interval": median_interval(ratio, 0.9),
            "ddp_ms_per_step": float(np.median(ddp)) / steps * 1e3,
            # what the runtime adds to each round (its Python, plus the spread of the step)
            "added_ms_per_round": float(np.median(train - ddp)) / steps * 1e3,
        },
    }


def median_interval(values: np.ndarray, level: float) -> list[float]:
    """A distribution-free ``level`` confidence interval for the median: the order statistics
    whose ranks bound the binomial(n, 1/2) count of values below it."""
    n = len(values)
    low = int(binom.ppf((1 - level) / 2, n, 0.5))  # values below the median ~ binomial(n, 1/2)
    ordered = np.sort(values)
    return [float(ordered[max(low - 1, 0)]), float(ordered[min(n - low, n - 1)])]


# ---- 2. DropCompute: real and simulated speed-up, parity ------------------------------------
def measured_comm(record: RunRecord, skip: int) -> float:
    """Mean T^c of a real run's rounds after the first ``skip`` (steps.jsonl ``comm_time``)."""
    return float(record.column("comm_time")[skip:].mean())


def measured_compute(record: RunRecord, skip: int) -> float:
    """Mean real (not injected) seconds per micro-batch after the first ``skip`` rounds: a
    rank's compute seconds less its injected ones, over the units it started (those counted,
    plus the one cut at tau when it dropped any)."""
    steps = record.steps[skip:]
    compute = np.array([r["rank_compute"] for r in steps]) - [r["rank_injected"] for r in steps]
    done = np.array([r["completed"] for r in steps])
    units = np.array([[r["micro_batches"] * r["local_steps"]] for r in steps])
    return float(compute.sum() / (done + (done < units)).sum())


def simulated(scenario: Scenario, text: str, comm: float, compute: float = 0.0) -> RunRecord:
    """``simulate`` told a real run's T^c and, if given, its real seconds per micro-batch."""
    delay = scenario.delay if compute == 0 else f"{scenario.delay}+const:value={compute!r}"
    told = replace(scenario, delay=delay, comm_time=f"const:value={comm!r}")
    return simulate(told, parse_strategy(text), SEED)


def dropcompute(workers: int, iterations: int) -> dict:
    scenario = Scenario(
        task="logreg",
        workers=workers,
        micro_batches=12,
        delay=DC_DELAY,
        iterations=iterations,
        eval_every=iterations,
    )
    texts = ("sync", DC_STRATEGY)
    configs = [
        TrainConfig(scenario=scenario, strategy=t, seed=SEED, inject=True, timeout=120)
        for t in texts
    ]
    real = [r.record for r in launch(configs, reserve(Endpoint("127.0.0.1", 0)))[0]]
    skip = parse_strategy(DC_STRATEGY).calibrate
    # each prediction is told what its real run measured beyond the injected delays: like
    # with like (the module docstring)
    comm = [measured_comm(r, skip) for r in real]
    compute = [measured_compute(r, skip) for r in real]
    runs = {
        "told": [simulated(scenario, *a) for a in zip(texts, comm, compute, strict=True)],
        "comm_only": [simulated(scenario, *a) for a in zip(texts, comm, strict=True)],
        "bare": [simulate(scenario, parse_strategy(t), SEED) for t in texts],
    }
    real_t = [mean_iteration(r, skip) for r in real]
    sim_t = {k: [mean_iteration(r, skip) for r in v] for k, v in runs.items()}
    errors = {k: [abs(r - s) / r for r, s in zip(real_t, v, strict=True)] for k, v in sim_t.items()}

    def variant(key: str) -> dict:
        iteration = sim_t[key]
        return {
            "iteration": dict(zip(texts, iteration, strict=True)),
            "speedup": iteration[0] / iteration[1],
            "parity_error": dict(zip(texts, errors[key], strict=True)),
        }

    told = sim_t["told"]
    return {
        "dropcompute_real_speedup": real_t[0] / real_t[1],
        "dropcompute_sim_speedup": told[0] / told[1],
        "dropcompute_real_over_sim": (real_t[0] / real_t[1]) / (told[0] / told[1]),
        "parity_iteration_time_error": max(errors["told"]),
        "dropcompute_detail": {
            "workers": workers,
            "micro_batches": 12,
            "delay": DC_DELAY,
            "strategy": DC_STRATEGY,
            "iterations": iterations,
            "rounds_measured": iterations - skip,
            "sim_told": "each run's measured T^c (--comm-time const) and real seconds per "
            "micro-batch (+const on --delay), over the measured rounds",
            "measured_comm_time": dict(zip(texts, comm, strict=True)),
            "measured_compute_per_micro_batch": dict(zip(texts, compute, strict=True)),
            "real_iteration": dict(zip(texts, real_t, strict=True)),
            "sim_iteration": dict(zip(texts, told, strict=True)),
            "parity_error": dict(zip(texts, errors["told"], strict=True)),
            "sim_told_comm_only": variant("comm_only"),
            "sim_told_nothing": variant("bare"),
            "real_threshold": real[1].summary["threshold"],
            "sim_threshold": runs["told"][1].summary["threshold"],
        },
    }


# ---- 3. time to target: tailtrain's best against PostLocalSGD -------------------------------
def post_local_sgd_job(rank: int, size: int, config: TrainConfig, period: int, warmup: int):
    """PyTorch's recipe: DDP + post_localSGD_hook (global allreduce for ``warmup`` steps, then
    within one-rank subgroups) + PostLocalSGDOptimizer averaging every ``period`` steps."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    world, _ = build_world(config)
    task, s = world.task, config.scenario
    m, every = s.micro_batches, s.eval_every
    model = DDP(task.module_at(task.init_params(config.seed)))
    solo, _ = dist.new_subgroups(group_size=1)
    model.register_comm_hook(PostLocalSGDState(None, solo, warmup), post_localSGD_hook)
    optimizer = PostLocalSGDOptimizer(
        torch.optim.SGD(model.parameters(), lr=world.lr), PeriodicModelAverager(period, warmup)
    )
    injector = Injector(world, rank, True)
    evals, clock = [], 0.0
    for step in range(s.iterations + 1):
        if step % every == 0 or step == s.iterations:
            evals.append({"time": clock, **evaluate(task, model, rank)})
        if step == s.iterations:
            break
        started = time.perf_counter()
        index = job_batches(world.partition, config.seed, task.batch_size, [rank], [step], m)[0]
        sleeps = injector.unit_times(1, m, clock)
        for u in range(m):
            sync = model.no_sync() if u < m - 1 else _Null()
            with sync:
                x, y = task.data.x_train[index[u]], task.data.y_train[index[u]]
                (F.cross_entropy(model(x), y) / m).backward()
            time.sleep(sleeps[u])
        optimizer.step()
        optimizer.zero_grad()
        clock += time.perf_counter() - started
    return evals


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def evaluate(task, model: DDP, rank: int) -> dict:
    """Rank 0 scores the average model as the runtime does; the others wait."""
    theta = torch.nn.utils.parameters_to_vector(model.module.parameters()).detach()
    averaged = theta.clone()
    dist.all_reduce(averaged)
    averaged /= dist.get_world_size()
    scores = task.evaluate(averaged) if rank == 0 else {}
    dist.barrier()
    return scores


def versus_post_local_sgd(
    workers: int, iterations: int, every: int, target: float, candidates: list[str], repeats: int
) -> dict:
    def scenario(rounds: int, eval_every: int) -> Scenario:
        return Scenario(
            task="logreg",
            lr=PLS_LR,
            workers=workers,
            micro_batches=4,
            delay=PLS_DELAY,
            iterations=rounds,
            eval_every=eval_every,
            target_loss=target,
        )

    configs = []
    for text in candidates:  # a round of H local steps is H iterations of the others
        h = parse_strategy(text).period
        if every % h:  # else the two sides would be scored on different grids
            raise ValueError(f"{text}: a round of {h} iterations does not divide every={every}")
        s = scenario(iterations // h, every // h)
        configs.append(TrainConfig(scenario=s, strategy=text, seed=SEED, inject=True, timeout=120))
    base = TrainConfig(scenario=scenario(iterations, every), strategy="sync", seed=SEED)
    ours_runs: dict[str, list] = {text: [] for text in candidates}
    theirs_runs: dict[int, list] = {period: [] for period in PLS_PERIODS}

    def run_ours() -> None:
        records = [r.record for r in launch(configs, reserve(Endpoint("127.0.0.1", 0)))[0]]
        for text, record in zip(candidates, records, strict=True):
            ours_runs[text].append(record.summary["time_to_target"])

    def run_theirs() -> None:
        for period in PLS_PERIODS:
            record = RunRecord()
            record.evals = on_ranks(post_local_sgd_job, workers, base, period, 2)[0]
            theirs_runs[period].append(time_to_target(record, target))

    for repeat in range(repeats):  # both sides in every repeat, each first in every other
        for side in (run_ours, run_theirs) if repeat % 2 == 0 else (run_theirs, run_ours):
            side()
    ours = {text: median_time(runs) for text, runs in ours_runs.items()}
    theirs = {period: median_time(runs) for period, runs in theirs_runs.items()}
    best_ours = min(((v, k) for k, v in ours.items() if v is not None), default=(None, None))
    best_theirs = min(((v, k) for k, v in theirs.items() if v is not None), default=(None, None))
    reached = best_ours[0] is not None and best_theirs[0] is not None
    return {
        "vs_post_local_sgd": best_ours[0] / best_theirs[0] if reached else None,
        "post_local_sgd_detail": {
            "task": "logreg",
            "lr": PLS_LR,
            "workers": workers,
            "micro_batches": 4,
            "delay": PLS_DELAY,
            "target_loss": target,
            "eval_every": every,
            "iterations": iterations,
            "repeats": repeats,
            "tailtrain_seconds": ours,
            "tailtrain_runs": ours_runs,
            "tailtrain_best": best_ours[1],
            "post_local_sgd_seconds": theirs,
            "post_local_sgd_runs": theirs_runs,
            "post_local_sgd_best_period": best_theirs[1],
            "warmup_steps": 2,
        },
    }


def median_time(runs: list[float | None]) -> float | None:
    """The (lower) median time to target over repeats, a run that never reached it counting
    as infinite: None only if most runs never reached it."""
    median = float(np.percentile([math.inf if t is None else t for t in runs], 50, method="lower"))
    return None if math.isinf(median) else median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--overhead-steps", type=int, default=100)
    parser.add_argument("--overhead-pairs", type=int, default=60)
    parser.add_argument("--dc-iterations", type=int, default=30)
    parser.add_argument("--pls-iterations", type=int, default=64)
    parser.add_argument("--pls-repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    out: dict = {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    long = 20 + args.overhead_steps
    out.update(overhead(OVERHEAD_TASK, 2, 20, long, args.overhead_pairs))
    out["overhead_long_step"] = overhead(LONG_STEP_TASK, 2, 20, long, args.overhead_pairs)
    out.update(dropcompute(8, args.dc_iterations))
    candidates = [
        DC_STRATEGY,
        "local-sgd:period=4",
        "local-sgd:period=8",
        "local-sgd:period=8,threshold=auto,calibrate=2",  # DropCompute's Local-SGD variant
    ]
    out.update(
        versus_post_local_sgd(
            4, args.pls_iterations, PLS_EVAL_EVERY, PLS_TARGET, candidates, args.pls_repeats
        )
    )
    out["bench_seconds"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    for key, value in out.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
