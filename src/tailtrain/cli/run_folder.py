"""`simulate`'s run folder: checkpoints, `--resume DIR`, `--overwrite` and fault drills.

A run started with ``--out DIR`` writes ``DIR/run.json`` (the flags that define it), streams
its rows to ``steps.jsonl`` / ``evals.jsonl`` and, with ``--checkpoint-every U``, keeps
``DIR/checkpoint.pt``. ``simulate --resume DIR`` goes on from that checkpoint with the flags in
``run.json`` and gives the same record, byte for byte, as a run never interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailtrain import __version__
from tailtrain.cli.scenario_args import MAX_SEED, scenario_from_args
from tailtrain.errors import UsageError

if TYPE_CHECKING:  # the simulator pulls in torch: import it only when a command runs
    from tailtrain.core.scenario import Scenario
    from tailtrain.core.session import RunControl
    from tailtrain.strategies.base import Strategy

log = logging.getLogger(__name__)

#: flags that define a run, kept in run.json; `--resume` takes them from there
RUN_FLAGS = ("strategy", "seed", "inject_fault", "on_nonfinite")
RUN_JSON = "run.json"
#: the fault drills a simulated run can play (kill and freeze need real processes)
SIMULATED_FAULTS = ("nan", "inf")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="U",
        help="save a checkpoint in --out every U updates, for --resume (default: none)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="go on with the interrupted run in DIR, with the flags it was started with; "
        "the record ends up byte-identical to an uninterrupted run's",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the run --out already holds")
    p.add_argument(
        "--inject-fault",
        action="append",
        default=None,
        metavar="nan:worker=W,step=S",
        help="fault drill: worker W's gradient becomes NaN (or inf:...) at update S; repeatable",
    )
    p.add_argument(
        "--on-nonfinite",
        choices=("skip", "raise"),
        default="skip",
        help="a gradient with NaN or inf: skip drops it from its update and counts it "
        "(column nonfinite); raise stops the run with exit status 3 (default: skip)",
    )


@dataclass(frozen=True)
class SimulateRun:
    """A simulate run as the flags (or a run folder) define it."""

    scenario: Scenario
    strategy: Strategy
    seed: int
    control: RunControl

    def kept(self) -> str:
        """Where what finished is, for the one line an interrupt prints."""
        folder = self.control.folder
        if folder is None:
            return "; nothing was kept (no --out)"
        from tailtrain.core.checkpoint import FILENAME

        if (folder / FILENAME).exists():
            return f"; the record so far is in {folder}, continue with --resume {folder}"
        return f"; the record so far is in {folder} (no checkpoint: add --checkpoint-every U)"


def prepare_run(args: argparse.Namespace) -> SimulateRun:
    """A new run from the flags, every one checked before anything is written."""
    from tailtrain.core.records import RUN_FILES, claim_folder
    from tailtrain.core.session import RunControl
    from tailtrain.faults import FaultPlan
    from tailtrain.strategies.registry import parse_strategy

    # a trace that recorded its rounds' noncompute seconds replays them unless told otherwise
    scenario = scenario_from_args(args).with_replayed_comm()
    strategy = parse_strategy(args.strategy)
    faults = FaultPlan.parse(args.inject_fault, scenario.groups, SIMULATED_FAULTS)
    _check_faults(faults, scenario)
    every = _checkpoint_every(args.checkpoint_every)
    if args.out is None:
        for flag, given in (("--checkpoint-every", every), ("--overwrite", args.overwrite)):
            if given:
                raise UsageError(f"{flag} needs --out DIR, the folder the run is kept in")
        control = RunControl(None, None, None, faults, args.on_nonfinite)
        return SimulateRun(scenario, strategy, args.seed, control)
    folder = claim_folder(args.out, RUN_FILES, overwrite=args.overwrite, resume_hint=True)
    info = {
        "tailtrain": __version__,
        "command": "simulate",
        "strategy": args.strategy,
        "seed": args.seed,
        "scenario": dataclasses.asdict(scenario),
        "checkpoint_every": every,
        "on_nonfinite": args.on_nonfinite,
        "inject_fault": faults.describe(),
    }
    control = RunControl(folder, every, None, faults, args.on_nonfinite, info)
    return SimulateRun(scenario, strategy, args.seed, control)


def resume_run(args: argparse.Namespace) -> SimulateRun:
    """The run in ``--resume DIR``, from its run.json and its checkpoint."""
    from tailtrain.core import checkpoint
    from tailtrain.core.session import RunControl
    from tailtrain.faults import FaultPlan
    from tailtrain.strategies.registry import parse_strategy

    folder = Path(args.resume)
    _check_resume_flags(args, folder)
    info = read_run_json(folder)
    scenario = scenario_of(folder, info)
    strategy = parse_strategy(info["strategy"])
    faults = FaultPlan.parse(info["inject_fault"], scenario.groups, SIMULATED_FAULTS)
    every = _checkpoint_every(args.checkpoint_every) or info["checkpoint_every"]
    saved = None
    if (folder / checkpoint.FILENAME).exists():
        saved = checkpoint.load(folder / checkpoint.FILENAME)
    elif _finished(folder):
        raise UsageError(f"the run in {folder} is finished; there is nothing to resume")
    else:
        log.warning("%s holds no checkpoint; the run starts again from update 0", folder)
    control = RunControl(folder, every, saved, faults, info["on_nonfinite"], info)
    return SimulateRun(scenario, strategy, info["seed"], control)


def _check_faults(faults: Any, scenario: Scenario) -> None:
    if faults.faults and scenario.task.split(":")[0].strip() == "none":
        raise UsageError("--inject-fault needs a task with a model; --task none has no gradients")


def _checkpoint_every(every: int | None) -> int | None:
    if every is not None and every < 1:
        raise UsageError(f"--checkpoint-every must be >= 1 updates, got {every}")
    return every


def _check_resume_flags(
    args: argparse.Namespace, folder: Path, flags: tuple[str, ...] = RUN_FLAGS
) -> None:
    """`--resume DIR` takes the run's flags from DIR; refuse any given that would differ."""
    from tailtrain.core.scenario import Scenario

    if not folder.is_dir():
        raise UsageError(f"--resume {folder} is not a folder; give the --out folder of a run")
    if args.overwrite:
        raise UsageError("--resume continues a run and --overwrite replaces it; give one")
    if args.out is not None and Path(args.out).resolve() != folder.resolve():
        raise UsageError(f"--resume writes into {folder} itself; drop --out {args.out}")
    defaults = args.defaults
    for dest in (*(f.name for f in dataclasses.fields(Scenario)), *flags):
        if dest not in defaults:  # a scenario field this command has no flag for (groups)
            continue
        if getattr(args, dest) != defaults[dest]:
            flag = "--" + dest.replace("_", "-")
            raise UsageError(
                f"--resume continues with the flags in {folder / RUN_JSON}; drop {flag}"
            )


def scenario_of(folder: Path, info: dict[str, Any]) -> Scenario:
    """The scenario run.json in ``folder`` records, or a one-line error."""
    from tailtrain.core.scenario import Scenario

    try:
        return Scenario(**info["scenario"])
    except TypeError as exc:
        raise UsageError(
            f"{folder / RUN_JSON}: its scenario is not one this tailtrain knows ({exc})"
        ) from None


def _finished(folder: Path) -> bool:
    path = folder / "summary.json"
    try:
        return not json.loads(path.read_text()).get("partial", False)
    except (OSError, ValueError, AttributeError):
        return False


#: run.json's keys and the types of their values
_RUN_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "tailtrain": (str,),
    "command": (str,),
    "strategy": (str,),
    "seed": (int,),
    "scenario": (dict,),
    "checkpoint_every": (int, type(None)),
    "on_nonfinite": (str,),
    "inject_fault": (list,),
}
#: train's run.json adds the runtime's flags (``train_info``)
_TRAIN_JSON_TYPES = {**_RUN_JSON_TYPES, "runtime": (dict,)}


def read_run_json(folder: Path, command: str = "simulate") -> dict[str, Any]:
    """run.json, parsed strictly: every key present, of its type, nothing else."""
    path = folder / RUN_JSON
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{folder} holds no {RUN_JSON}; it is not a {command} --out folder"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path} is not readable JSON: {str(exc)[:120]}") from None
    if isinstance(info, dict) and info.get("command") not in (None, command):
        raise UsageError(f"{path} is a {info['command']} run; continue it with that command")
    expected = _TRAIN_JSON_TYPES if command == "train" else _RUN_JSON_TYPES
    if not isinstance(info, dict) or set(info) != set(expected):
        raise UsageError(f"{path} is not a tailtrain run.json; its keys differ")
    for key, types in expected.items():
        value = info[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise UsageError(f"{path}: {key} has the wrong type ({type(value).__name__})")
    if info["command"] != command or info["on_nonfinite"] not in ("skip", "raise"):
        raise UsageError(f"{path} is not a {command} run.json (command, on_nonfinite)")
    if not 0 <= info["seed"] <= MAX_SEED:
        raise UsageError(f"{path}: seed {info['seed']} must lie in 0..2^63-1")
    if not all(isinstance(f, str) for f in info["inject_fault"]):
        raise UsageError(f"{path}: inject_fault must be a list of fault specs")
    return info


# ---- train's run folder ------------------------------------------------------------------------
#: flags of `train` that define its run besides simulate's; `--resume` refuses them
TRAIN_FLAGS = (*RUN_FLAGS, "backend", "fail_at", "worker_timeout")
#: what a fresh train run clears from its folder besides simulate's run files


def train_info(args: argparse.Namespace, scenario: Scenario, faults: Any) -> dict[str, Any]:
    """train's run.json: simulate's keys and ``runtime`` (injection, backend, limits)."""
    return {
        "tailtrain": __version__,
        "command": "train",
        "strategy": args.strategy,
        "seed": args.seed,
        "scenario": dataclasses.asdict(scenario),
        "checkpoint_every": args.checkpoint_every,
        "on_nonfinite": args.on_nonfinite,
        "inject_fault": faults.describe(),
        "runtime": {
            "inject": args.delay is not None,
            "backend": args.backend,
            "timeout": args.timeout,
            "max_restarts": args.max_restarts,
            "fail_at": None,  # --fail-at is a raise drill in inject_fault; older runs kept it here
            "worker_timeout": args.worker_timeout,
            "on_rank_loss": args.on_rank_loss,
            "restart_lost": args.restart_lost,
        },
    }


def resume_train(args: argparse.Namespace) -> tuple[dict[str, Any], Scenario]:
    """The run in ``train --resume DIR``: its run.json and scenario. ``--checkpoint-every``,
    ``--max-restarts`` and ``--timeout`` may be given anew; the flags that define the run not."""
    from tailtrain.core import checkpoint

    folder = Path(args.resume)
    _check_resume_flags(args, folder, TRAIN_FLAGS)
    info = read_run_json(folder, "train")
    runtime = info["runtime"]
    kinds = {"inject": bool, "backend": (str, type(None)), "timeout": (int, float)}
    kinds |= {"max_restarts": int, "fail_at": (list, type(None))}
    kinds |= {"worker_timeout": (int, float, type(None))}
    # kept since issue 26; a run.json from before has neither (it ran with the defaults)
    later = {"on_rank_loss": str, "restart_lost": int}
    fail_at = runtime.get("fail_at")
    bad_fail_at = fail_at is not None and (
        len(fail_at) != 2 or not all(type(v) is int and v >= 0 for v in fail_at)
    )
    if (
        not set(kinds) <= set(runtime) <= set(kinds) | set(later)
        or not all(isinstance(runtime[k], t) for k, t in (kinds | later).items() if k in runtime)
        or bad_fail_at
    ):
        raise UsageError(f"{folder / RUN_JSON}: runtime is not train's (keys or types differ)")
    scenario = scenario_of(folder, info)
    if not (folder / checkpoint.FILENAME).exists():
        if _finished(folder):
            raise UsageError(f"the run in {folder} is finished; there is nothing to resume")
        log.warning("%s holds no checkpoint; the run starts again from step 0", folder)
    return info, scenario
