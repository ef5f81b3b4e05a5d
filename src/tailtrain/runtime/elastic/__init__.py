"""The elastic layer under every topology (issue 35): lose a rank, keep training, and take a
restarted one back. One membership protocol (``shrink``: generations, census, forming, join
and grow) over the learned deadline (``deadline``), a generation's watched collectives
(``group``) and the agent's store (``store``); after a regroup one lead, one hand-over and one
rule for the live world (``handover``); and one set of refusals before any process starts
(``refusals``), and where one round is reduced over several groups (a sharded job's
replicate groups), one decision in the store to apply it everywhere or nowhere (``commit``).
What the lead hands over is the run's state envelope, built by
``core.envelope`` as every checkpoint is. The allreduce's rounds, the partial collective and
``integrate.StragglerStep`` stand on it; it imports none of them."""
