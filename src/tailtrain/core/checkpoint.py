"""Checkpoints of a simulated run: everything needed to continue it bit for bit.

A checkpoint holds the engine's state (clocks, model versions, the update path's deferred
term, every random generator), the rule's state (``Strategy.state_dict``), the evaluator's
position and the record so far. It is written atomically (a temporary file, then
``os.replace``) and read with ``torch.load(weights_only=True)``: nothing but tensors,
numbers, strings, lists, tuples and dicts, so a checkpoint file cannot run code.

Engines describe their state as the attributes of their parts (:func:`capture`); what a part
holds is converted here: numpy arrays become tensors (bit for bit, dtype kept), numpy
Generators their ``bit_generator.state`` (a dict of ints), frozen dataclasses of arrays their
fields. On load (:func:`restore`) a value takes its type from the live object it replaces,
never from the file, so a file cannot name a class to build.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailtrain.errors import UsageError

#: bumped whenever what a checkpoint holds changes incompatibly
FORMAT = 2  # 2: the state envelope (``core.envelope``)
FILENAME = "checkpoint.pt"

_ARRAY, _SCALAR, _RNG, _FIELDS = "__ndarray__", "__npscalar__", "__rng__", "__fields__"
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def pack(value: Any) -> Any:
    """``value`` as containers ``torch.load(weights_only=True)`` reads back exactly."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        return {_SCALAR: value.dtype.str, "value": value.item()}
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("cannot checkpoint a numpy array of Python objects")
        return {_ARRAY: torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, np.random.Generator):
        return {_RNG: value.bit_generator.state}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_FIELDS: {f.name: pack(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return tuple(pack(v) for v in value)
    if isinstance(value, list):
        return [pack(v) for v in value]
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    raise TypeError(f"cannot checkpoint a {type(value).__name__}")


def unpack(data: Any, current: Any = None) -> Any:
    """The value :func:`pack` wrote; ``current`` (the live value it replaces) gives the type
    of a dataclass and the Generator to set, so both are changed or rebuilt, never named."""
    if isinstance(data, list):
        return [unpack(v) for v in data]
    if isinstance(data, tuple):
        hints = current if isinstance(current, tuple) and len(current) == len(data) else ()
        return tuple(unpack(v, hints[i] if hints else None) for i, v in enumerate(data))
    if not isinstance(data, dict):
        return data
    if _ARRAY in data:
        return data[_ARRAY].numpy().copy()
    if _SCALAR in data:
        return np.dtype(data[_SCALAR]).type(data["value"])
    if _RNG in data:
        return _generator(data[_RNG], current)
    if _FIELDS in data:
        if not dataclasses.is_dataclass(current) or isinstance(current, type):
            raise UsageError("the checkpoint does not fit this run: a record has no live type")
        fields = data[_FIELDS]
        return type(current)(**{k: unpack(v, getattr(current, k)) for k, v in fields.items()})
    return {
        k: unpack(v, current.get(k) if isinstance(current, dict) else None) for k, v in data.items()
    }


def _generator(state: dict[str, Any], current: Any) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise UsageError(f"the checkpoint names bit generator {name!r}; expected a numpy one")
    rng = current if isinstance(current, np.random.Generator) else None
    if rng is None or type(rng.bit_generator).__name__ != name:
        rng = np.random.Generator(getattr(np.random, name)())
    rng.bit_generator.state = state  # in place: whoever shares the generator sees it
    return rng


def capture(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The attributes of ``obj`` but ``skip`` (what the scenario and seed rebuild), packed."""
    return {name: pack(value) for name, value in vars(obj).items() if name not in skip}


def restore(obj: Any, data: dict[str, Any]) -> None:
    """Set the attributes :func:`capture` saved back on ``obj``, each in its live type."""
    for name, value in data.items():
        if not hasattr(obj, name):
            raise UsageError(
                f"the checkpoint does not fit this run: {type(obj).__name__} "
                f"has no {name!r}; resume with the tailtrain version that wrote it"
            )
        setattr(obj, name, unpack(value, getattr(obj, name)))


def save(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically: a reader sees the old file or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save({"format": FORMAT, **data}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """A checkpoint :func:`save` wrote; one-line errors for anything else."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path}") from None
    except Exception as exc:  # torch raises many kinds for a foreign or damaged file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{path} is not a readable tailtrain checkpoint: {reason[:200]}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise UsageError(
            f"{path} is not a tailtrain checkpoint of format {FORMAT} (found {found!r})"
        )
    return data


#: what the scenario and seed rebuild in a delay process and in job durations
DELAY_PROCESS_STATIC = ("model", "pattern", "notes")
DURATIONS_STATIC = ("_process",)
#: what the scenario and seed rebuild in a communication-time stream (``delays.CommStream``)
COMM_STATIC = ("model", "buffer")
#: what a model holder (trainer, learner, model store) gets from the world
MODEL_STATIC = ("task", "partition", "update", "drawn")


def _kept_process(process: Any) -> Any:
    """The process whose state a checkpoint keeps: replica groups' source keeps its ranks'
    (``delays.groups.GroupedDelays``), the grouping being the scenario's to rebuild."""
    from tailtrain.delays.groups import GroupedDelays

    return process.ranks if isinstance(process, GroupedDelays) else process


def delay_state(process: Any) -> dict[str, Any]:
    """The delay process's generators, pattern state and position (``delays.DelayProcess``)."""
    try:
        return capture(_kept_process(process), DELAY_PROCESS_STATIC)
    except TypeError:
        raise UsageError(
            f"cannot checkpoint the delay source {type(process).__name__}; checkpoints "
            "need the scenario's own delay process"
        ) from None


def restore_delays(process: Any, data: dict[str, Any]) -> None:
    """Undo :func:`delay_state` on the run's delay source."""
    restore(_kept_process(process), data)


def with_comm(owner: Any, skip: tuple[str, ...]) -> dict[str, Any]:
    """:func:`capture` of ``owner`` but ``skip``, its T^c stream (``owner.comm``) under "comm"."""
    return {**capture(owner, (*skip, "comm")), "comm": capture(owner.comm, COMM_STATIC)}


def restore_with_comm(owner: Any, data: dict[str, Any]) -> None:
    """Undo :func:`with_comm`; also reads checkpoints written before the three T^c samplers
    became one ``CommStream``, whose owners held the generator (and a buffer) themselves."""
    data = dict(data)
    comm = data.pop("comm", None)
    if comm is None and "_comm_rng" in data:
        comm = {"_rng": data.pop("_comm_rng")}
        if "_comm" in data:  # RoundClock's buffer of drawn rounds
            comm["_left"] = data.pop("_comm")
    restore(owner, data)
    if comm is not None:
        restore(owner.comm, comm)
