"""The allreduce topology on real ranks: every rank joins one weighted allreduce per round
(``rounds``), over the shared collectives (``runtime.reduce``)."""
