"""Each topology's ledger, shared by the simulator (``tailtrain.sim``) and the runtime
(``tailtrain.runtime``): arrivals, record rows and summaries, and the protocol facts
both engines must agree on, so that they agree by construction rather than by test:
``allreduce``, ``partial`` and ``ps`` (its scheduling as one pure transition function). The
run budget, which every topology shares, is ``core.scenario.budget_spent``."""
