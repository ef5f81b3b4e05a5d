"""Each topology's ledger, shared by the simulator (``tailtrain.sim``) and the runtime
(``tailtrain.runtime``): budgets, arrivals, record rows and summaries, and the protocol facts
both engines must agree on, so that they agree by construction rather than by test.
``allreduce`` and ``partial`` so far; the parameter server's is still split between
``sim.ps`` and ``runtime.ps``."""
