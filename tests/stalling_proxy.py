"""A TCP proxy in front of PostgreSQL that can stall: while ``stalled`` it keeps every connection open and
accepts new ones, but forwards nothing either way, as a frozen primary, a hung pooler or a network partition
looks to a client (which sees no error, only no answer)."""

from __future__ import annotations

import selectors
import socket
import threading
from urllib.parse import urlsplit, urlunsplit


class StallingProxy:
    def __init__(self, upstream_dsn: str) -> None:
        parts = urlsplit(upstream_dsn)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        self.dsn = urlunsplit(parts._replace(netloc=(netloc[0] + "@" if len(netloc) == 2 else "")
                                             + f"127.0.0.1:{port}"))
        self.stalled = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalled.set()
        self._flowing.clear()

    def resume(self) -> None:
        self.stalled.clear()
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            for s in peer:
                selector.register(s, selectors.EVENT_READ)
            while not self._closed:
                self._flowing.wait()
                for key, _ in selector.select(timeout=0.2):
                    if self.stalled.is_set():
                        break  # what arrived waits, unread, until the stall ends
                    try:
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            raise OSError("closed")
                        peer[key.fileobj].sendall(data)  # type: ignore[index]
                    except OSError:
                        for s in peer:
                            s.close()
                        return
