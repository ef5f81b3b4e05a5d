"""Training tasks for the simulator and the runtime: data, a model over a flat θ, batched
per-worker gradients, and the data partitions among workers.

The names below load on first use (PEP 562 ``__getattr__``): a module that needs only one
light piece of this package, such as ``tasks.stream`` (a user's own loop deals its batches
with it), loads no built-in task (gpt, cifar10, mnist, ...) and none of their models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tailtrain.lazy import lazy_names

#: public name -> the module of this package that defines it
_NAMES: dict[str, str] = {
    "Dataset": "tailtrain.tasks.data",
    "KNOWN_PARTITIONS": "tailtrain.tasks.partition",
    "Partition": "tailtrain.tasks.partition",
    "PartitionState": "tailtrain.tasks.partition",
    "parse_partition": "tailtrain.tasks.partition",
    "KNOWN_TASKS": "tailtrain.tasks.registry",
    "parse_task": "tailtrain.tasks.registry",
    "Task": "tailtrain.tasks.task",
}

__all__ = [
    "KNOWN_PARTITIONS",
    "KNOWN_TASKS",
    "Dataset",
    "Partition",
    "PartitionState",
    "Task",
    "parse_partition",
    "parse_task",
]


__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
    from tailtrain.tasks.data import Dataset
    from tailtrain.tasks.partition import (
        KNOWN_PARTITIONS,
        Partition,
        PartitionState,
        parse_partition,
    )
    from tailtrain.tasks.registry import KNOWN_TASKS, parse_task
    from tailtrain.tasks.task import Task
