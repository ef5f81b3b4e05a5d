"""The real runtime of `tailtrain train`: strategies on torch.distributed ranks.

The same strategy objects as the simulator decide (``control``); a topology module runs the
rounds (the subpackages ``allreduce``, ``partial`` and ``ps``), over the
process group's collectives (``reduce``), with injected delays and faults (``inject``) and
run records, traces and logs (``telemetry``). ``launching`` starts the ranks; ``drills`` are
``tailtrain bench``'s tools over it.
"""
