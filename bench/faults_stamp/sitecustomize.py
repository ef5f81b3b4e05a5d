"""Time stamps for ``bench_faults.py``'s tailtrain rows, loaded only where it puts this folder
on PYTHONPATH and sets ``TAILTRAIN_FAULTS_STAMPS`` (every process of the run imports it).

tailtrain's record keeps a training clock (settled rounds' seconds, a restart's downtime left
out) and writes its rows in batches, so the benchmark needs each rank's own wall clock at each
step. Every topology's rank calls ``runtime.inject.FaultDrill.before(step)`` as it starts work
for an update (``runtime.rank.drive_rank``): wrapped here, it appends
``{"worker", "rank", "step", "t": time.time()}`` to ``stamps-w{worker}-{pid}.jsonl`` and then
runs unchanged. A rank starting update s has committed its previous one; a kill or freeze
drill of update s fires right after its stamp. Nothing else is changed.
"""

import os

_FOLDER = os.environ.get("TAILTRAIN_FAULTS_STAMPS")
if _FOLDER:
    try:
        import json
        import time

        from tailtrain.runtime import inject

        _before = inject.FaultDrill.before

        def _stamped(self, step):  # type: ignore[no-untyped-def]
            path = os.path.join(_FOLDER, f"stamps-w{self.worker}-{os.getpid()}.jsonl")
            row = {"worker": self.worker, "rank": self.rank, "step": int(step), "t": time.time()}
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            return _before(self, step)

        inject.FaultDrill.before = _stamped
    except ImportError:  # a tree without the drill hook: the row says no stamps came
        pass
