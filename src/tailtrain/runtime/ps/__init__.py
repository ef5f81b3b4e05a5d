"""The parameter-server topology on real ranks: the server (``server``), LGC's stragglers'
blocks (``lgc``) and what arrives (``arrivals``), its keeping (``keep``), the workers
(``worker``), their wire (``wire``) and liveness (``liveness``), and the runner for a user's
own model (``runner``)."""
