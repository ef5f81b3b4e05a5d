"""Refuse, before any work, a simulation that cannot fit in this machine's memory.

The engines draw delays ``delays.schedule.BLOCK`` iterations at a time for every worker (and every
micro-batch): the delay process's block, the per-job tables of compute and communication
times and the micro-batch progress shares, with a transient copy or two while a block is
appended. Model tasks add per-worker gradients and local copies of D parameters. The
estimate errs on the generous side; a run above half of the physical memory is refused with
its figures, instead of ending in an allocation traceback halfway.
"""

from __future__ import annotations

import os

from tailtrain.delays.schedule import BLOCK
from tailtrain.errors import UsageError
from tailtrain.strategies.base import JOB_BITS

#: arrival keys pack a worker above JOB_BITS bits of job into an int64
MAX_WORKERS = 2 ** (63 - JOB_BITS) - 1
#: share of the physical memory a run may plan to use
MEMORY_SHARE = 0.5


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def estimate_bytes(workers: int, micro_batches: int | None, dim: int = 0) -> int:
    """Bytes the engines hold for ``workers`` workers (float64 delay tables, float32 models)."""
    m = micro_batches or 1
    delays = 8 * BLOCK * workers * (3 * m + 3)
    models = 4 * 4 * workers * dim
    return delays + models


def check_fits(workers: int, micro_batches: int | None, dim: int = 0) -> None:
    """Refuse ``workers`` beyond the arrival keys' range or beyond the memory share."""
    if workers > MAX_WORKERS:
        raise UsageError(f"--workers {workers} is too many: at most {MAX_WORKERS} fit a run")
    what = "delay tables and models" if dim else "delay tables"
    need, have = estimate_bytes(workers, micro_batches, dim), physical_memory()
    if dim and have is not None and need > MEMORY_SHARE * have:
        # the per-worker copies of a D-parameter model grow with N: say which N would fit
        fits = int(MEMORY_SHARE * have // estimate_bytes(1, micro_batches, dim))
        raise UsageError(
            f"--workers {workers} needs about {need / 2**30:.3g} GiB of memory for the "
            f"per-worker copies of a {dim:,}-parameter model and the delay tables, more than "
            f"half of this machine's {have / 2**30:.3g} GiB; at most {fits} workers fit"
        )
    check_memory(need, f"--workers {workers}", what)


def check_memory(need: int, flag: str, what: str) -> None:
    """Refuse a plan of ``need`` bytes above :data:`MEMORY_SHARE` of the physical memory."""
    have = physical_memory()
    if have is not None and need > MEMORY_SHARE * have:
        raise UsageError(
            f"{flag} needs about {need / 2**30:.3g} GiB of memory for {what}, more than half "
            f"of this machine's {have / 2**30:.3g} GiB; ask for a smaller size"
        )
