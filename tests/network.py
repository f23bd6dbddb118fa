"""Local sockets only: the tests, and the oracle processes they start, never reach the network."""

from __future__ import annotations

import socket

REAL_CONNECT = socket.socket.connect


class NetworkBlocked(RuntimeError):
    pass


def guarded_connect(sock, address):
    """Allow local sockets only: code that reaches for the internet fails at once."""
    host = address[0] if isinstance(address, tuple) else address
    if sock.family == socket.AF_UNIX or host in ("127.0.0.1", "::1", "localhost"):
        return REAL_CONNECT(sock, address)
    raise NetworkBlocked(f"Tests must not use the network (tried to connect to {address!r}).")
