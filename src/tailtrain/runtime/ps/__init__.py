"""The parameter-server topology on real ranks: the server (``server``), LGC's stragglers'
blocks (``lgc``) and what arrives (``arrivals``), its keeping (``keep``), the workers
(``worker``), their wire (``wire``) and liveness (``liveness``). A user's own model on it
starts from ``launching.own_model``."""
