"""Where a job meets: the rendezvous endpoint, checked before any process starts.

A local launch hosts the rendezvous itself, so ``--rdzv-endpoint`` must be an address of
this machine with a free port (:func:`reserve`; port 0 picks one); under torchrun the store
at ``MASTER_ADDR:MASTER_PORT`` must resolve and answer (:func:`check_rendezvous`). Each
refusal is one ``UsageError`` line.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tailtrain.errors import UsageError


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def check_rendezvous(env: Mapping[str, str], timeout: float) -> None:
    """Under torchrun: the store at MASTER_ADDR:MASTER_PORT resolves and answers (a rank 0
    outside torchrun hosts it itself, so only the name is checked there)."""
    host, port = env["MASTER_ADDR"], int(env.get("MASTER_PORT", "29500"))
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise UsageError(f"the rendezvous host MASTER_ADDR={host!r} does not resolve") from None
    if env["RANK"] == "0" and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=min(1.0, timeout)).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise UsageError(
                    f"cannot reach the rendezvous at {host}:{port} within --timeout "
                    f"{timeout:g}s; check MASTER_ADDR/MASTER_PORT"
                ) from None
            time.sleep(0.2)


def parse_endpoint(text: str) -> Endpoint:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--rdzv-endpoint {text!r} must be HOST:PORT with PORT in 0..65535")
    return Endpoint(host.strip("[]"), int(port))


def address_of(endpoint: Endpoint) -> tuple[int, int, int, tuple]:
    """The socket family, kind, protocol and address ``endpoint`` names; one line if its host
    does not resolve."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            endpoint.host, endpoint.port, type=socket.SOCK_STREAM
        )[0]
    except (socket.gaierror, UnicodeError):
        raise UsageError(f"--rdzv-endpoint host {endpoint.host!r} does not resolve") from None
    return family, kind, proto, address


def reserve(endpoint: Endpoint) -> Endpoint:
    """Check that the local launcher can host the rendezvous there; port 0 picks a free one.

    The port is released again before the launcher binds it (as PyTorch's own tests do).
    """
    family, kind, proto, address = address_of(endpoint)
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise UsageError(unusable(endpoint, exc)) from None
        return Endpoint(endpoint.host, sock.getsockname()[1])


def unusable(endpoint: Endpoint, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"--rdzv-endpoint port {endpoint.port} is in use; choose another, or 0 (a free one)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"--rdzv-endpoint {endpoint} is unreachable: {endpoint.host} is not an address of "
            "this machine, and a local launch hosts the rendezvous itself (use torchrun "
            "across machines)"
        )
    return f"--rdzv-endpoint {endpoint} cannot be used: {exc.strerror}"
