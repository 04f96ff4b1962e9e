"""A counting proxy between a client and PostgreSQL: what each system does on the wire.

The benchmark's round-trip, statement and transaction counts come from here, measured, not
from prose. The proxy relays bytes unchanged and reads the protocol's message headers:

- round trips: client ``Query`` (simple protocol) and ``Sync`` (extended protocol; one per
  statement execution, also for a prepared statement) messages, each answered by one
  ``ReadyForQuery``;
- statements: server ``CommandComplete`` messages (BEGIN and COMMIT included);
- transactions: server ``ReadyForQuery`` with status idle (a COMMIT, or a statement run
  outside a transaction, ends one).

Clients connect with ``sslmode=disable`` and ``gssencmode=disable`` (loopback), so the
stream is plain.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass


@dataclass
class Counts:
    round_trips: int = 0
    statements: int = 0
    transactions: int = 0

    def per(self, operations: int) -> Counts:
        return Counts(
            round_trips=self.round_trips / operations,
            statements=self.statements / operations,
            transactions=self.transactions / operations,
        )

    def label(self) -> str:
        return (
            f"{self.round_trips:g} round trips, {self.statements:g} statements, "
            f"{self.transactions:g} transactions"
        )


class CountingProxy:
    """``with CountingProxy() as proxy: … proxy.reset(); work; proxy.counts``."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.upstream = upstream
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self.counts = Counts()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self, database: str, user: str = "postgres") -> str:
        return (
            f"postgresql://{user}@127.0.0.1:{self.port}/{database}"
            "?sslmode=disable&gssencmode=disable"
        )

    def reset(self) -> None:
        with self._lock:
            self.counts = Counts()

    def snapshot(self) -> Counts:
        with self._lock:
            return Counts(**vars(self.counts))

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    # --- relaying ------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        buffer = b""
        startup = from_client  # the client's first message has no type byte
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                # Count before relaying: once the peer has the bytes, they are counted.
                buffer += data
                while True:
                    if startup:
                        if len(buffer) < 4:
                            break
                        (length,) = struct.unpack("!I", buffer[:4])
                        if len(buffer) < length:
                            break
                        buffer, startup = buffer[length:], False
                        continue
                    if len(buffer) < 5:
                        break
                    kind = buffer[:1]
                    (length,) = struct.unpack("!I", buffer[1:5])
                    if len(buffer) < 1 + length:
                        break
                    body = buffer[5 : 1 + length]
                    buffer = buffer[1 + length :]
                    self._count(kind, body, from_client)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _count(self, kind: bytes, body: bytes, from_client: bool) -> None:
        with self._lock:
            if from_client and kind in (b"Q", b"S"):
                self.counts.round_trips += 1
            elif not from_client and kind == b"C":
                self.counts.statements += 1
            elif not from_client and kind == b"Z" and body[:1] == b"I":
                self.counts.transactions += 1
