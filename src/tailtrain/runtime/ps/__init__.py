"""The parameter-server topology on real ranks: the server (``server``) and its keeping
(``keep``), the workers (``worker``), their wire (``wire``) and liveness (``liveness``), and
the runner for a user's own model (``runner``)."""
