"""The partial-collective topology on real ranks (eager-SGD): the rounds and the agreed model
(``rounds``) over the partial allreduce (``collective``)."""
