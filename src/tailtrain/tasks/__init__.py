"""Training tasks for the simulator and the runtime: data, a model over a flat θ, batched
per-worker gradients, and the data partitions among workers."""

from tailtrain.tasks.data import Dataset
from tailtrain.tasks.partition import KNOWN_PARTITIONS, Partition, PartitionState, parse_partition
from tailtrain.tasks.registry import KNOWN_TASKS, parse_task
from tailtrain.tasks.task import Task

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
