"""``StragglerProbe.begin_step`` / ``end_step``: a step opened with the data time its caller
measured (a trainer's callback, ``tailtrain.lightning``), on one process."""

from __future__ import annotations

import numpy as np

from tailtrain.delays.trace import read_trace
from tailtrain.integrate.probe import SAMPLES, StragglerProbe


def test_a_step_opened_with_its_data_time_keeps_it_out_of_the_compute(tmp_path):
    """The data given is the step's data column, its samples the samples column, and its
    compute only what ran between the two calls; a ``begin_step`` with a step open closes it
    first, an ``end_step`` with none open does nothing."""
    probe = StragglerProbe(tmp_path, every=10**6, warmup=0)
    probe.begin_step(0.25, samples=5)
    probe.end_step()
    probe.end_step()  # nothing open: nothing closed
    probe.begin_step(0.5)  # samples unknown
    probe.begin_step()  # closes the step before
    probe.note_samples(7)
    probe.close()
    assert probe.steps == 3
    history = probe.history[:, 0]  # (steps, data compute wait samples), rank 0
    np.testing.assert_array_equal(history[:, 0], [0.25, 0.5, 0.0])
    assert (history[:, 1] < 0.25).all() and (history[:, 2] == 0).all()  # no data in compute
    np.testing.assert_array_equal(np.isnan(history[:, SAMPLES]), [False, True, False])
    assert history[0, SAMPLES] == 5 and history[2, SAMPLES] == 7
    trace = read_trace(tmp_path / "trace.csv")
    assert (trace.seconds[:2] >= [0.25, 0.5]).all()  # seconds = data + compute
