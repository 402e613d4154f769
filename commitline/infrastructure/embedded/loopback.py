"""Local TCP port allocation for the embedded services.

Owns :func:`free_port`: ask the kernel for an unused port on 127.0.0.1. The
port is released again before it is returned, so another process *could* grab
it before the server binds; to make that unlikely between services started by
this process, a port already handed out here is never handed out twice.
:func:`is_free` says whether a given port could be bound now (a server restarting
on the port it had, so the processes connected to it find it there again);
:func:`listens` whether something accepts TCP connections on it.
"""

from __future__ import annotations

import socket
import threading

_issued: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on *host* that nothing listens on right now."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        with _lock:
            if port not in _issued:
                _issued.add(port)
                return port
    raise RuntimeError(f"could not find a free TCP port on {host}")


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port`` and it could be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def listens(port: int, host: str = "127.0.0.1", *, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` within *timeout* seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
