"""Telling the processes that wait on a run that it changed, so a long-poll sleeps on a
notification instead of reading the run again and again.

A change is announced by the transaction that makes it, and heard only once it commits:

- **PostgreSQL**: ``NOTIFY cairn_run_changed, '<run id>'``. The commit sends it from its
  own statement (``commit_sql``: for externally driven runs, the only ones a runner waits
  on, so a worker's commit pays nothing), other writers with ``run_changed``. PostgreSQL
  delivers it when the transaction commits, to every web process: each has one listening
  connection (a daemon thread, started by the first wait) that wakes its waiters.
- **SQLite** (the embedded default, one machine): the same wake-up in process, on commit
  (``transaction.on_commit``). A change made by another process (a worker settling a
  cancel) is seen by the waiter's re-check, every ``SQLITE_RECHECK_SECONDS``.

A waiter that cannot hear notifications (the listener lost its connection) re-checks every
``RECHECK_SECONDS``; a notification is only ever a reason to look again.

A waiter is anything with a thread-safe ``set()``: a ``threading.Event`` for a wait that
holds its thread (``runtime.services.runner.run_wait_next``), or a ``LoopWake`` for a wait
that sleeps on the web process's event loop and holds no thread (``cairn.asgi``). Waiters
and announcements meet on ``_key``: one spelling of the run's id, however a caller wrote it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar
from uuid import UUID

from django.db import connection, transaction

log = logging.getLogger("cairn.checkpoints")

CHANNEL = "cairn_run_changed"
RECHECK_SECONDS = 10.0  # PostgreSQL: a safety net under the notifications
SQLITE_RECHECK_SECONDS = 1.0  # SQLite: how soon another process's change is seen


class Waiter(Protocol):
    def set(self) -> None: ...


W = TypeVar("W", bound=Waiter)


_lock = threading.Lock()
_waiters: dict[str, set[Waiter]] = {}


def _key(run_id: object) -> str:
    """The run's id as changes are announced and subscribed (PostgreSQL's ``id::text``: a
    UUID's lowercase hyphenated form), so a caller spelling it otherwise is still woken."""
    if isinstance(run_id, UUID):
        return str(run_id)
    try:
        return str(UUID(str(run_id)))
    except ValueError:
        return str(run_id)  # not a run's id: nothing announces it, nothing is woken


def _wake(run_id: str) -> None:
    with _lock:
        waiters = list(_waiters.get(run_id, ()))
    for waiter in waiters:
        waiter.set()


class LoopWake:
    """A waiter for a coroutine: ``set()`` may be called from any thread (the listener's,
    a committing request's) and wakes ``wait()`` on the loop that made it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def set(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)

    async def wait(self, timeout: float) -> None:
        """Until woken or ``timeout`` seconds passed; the wake-up is consumed."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            pass
        self.event.clear()


@contextmanager
def run_change_subscribed(run_id: object, waiter: W) -> Iterator[W]:
    """``waiter.set()`` is called when the run changes (a committed change), for the
    duration of the block. Touches no database: call ``run_change_listen`` from a thread
    that may (on PostgreSQL the listener must be up before the waiter's first look)."""
    key = _key(run_id)
    with _lock:
        _waiters.setdefault(key, set()).add(waiter)
    try:
        yield waiter
    finally:
        with _lock:
            waiters = _waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del _waiters[key]


def run_change_listen() -> None:
    """Make sure this process hears other processes' changes (PostgreSQL: its listening
    connection is up). Blocks up to two seconds the first time; call it before the look
    whose answer a wait then sleeps on, so no change falls between them."""
    if connection.vendor == "postgresql":
        _listener_start(connection.get_connection_params())


def recheck_seconds() -> float:
    """How long a waiter may sleep before it looks again without a notification: long while
    this process listens (PostgreSQL), short otherwise (SQLite, or a lost listener). Touches
    no database connection, so the event loop may ask."""
    return RECHECK_SECONDS if _listener.listening.is_set() else SQLITE_RECHECK_SECONDS


def run_changed(*, run_id: object) -> None:
    """Announce, inside the transaction that changes the run, that it changed: waiters in
    every process wake when (and only if) it commits. One statement on PostgreSQL."""
    key = _key(run_id)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, key])
    else:
        transaction.on_commit(lambda: _wake(key))


def run_committed(*, run_id: object) -> None:
    """A commit wrote the run (its statement notified other processes on PostgreSQL): wake
    this process's waiters once the transaction commits."""
    key = _key(run_id)
    transaction.on_commit(lambda: _wake(key))


class _Listener:
    """One LISTEN connection per process, on a daemon thread; reconnects after a loss."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.listening = threading.Event()
        self.stopping = threading.Event()
        self.start_lock = threading.Lock()

    def start(self, params: dict) -> None:
        with self.start_lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.thread = threading.Thread(
                target=self.run, args=(dict(params),), name="cairn-run-changes", daemon=True
            )
            self.thread.start()
        self.listening.wait(timeout=2)  # the first wait starts listening before it looks

    def run(self, params: dict) -> None:
        import psycopg

        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        while not self.stopping.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    while not self.stopping.is_set():
                        for notify in conn.notifies(timeout=1.0):
                            _wake(notify.payload)
            except Exception:  # a lost connection: waiters re-check meanwhile
                log.warning("the run-change listener lost its connection", exc_info=True)
            self.listening.clear()
            self.stopping.wait(1.0)

    def stop(self) -> None:
        with self.start_lock:
            thread, self.thread = self.thread, None
            if thread is None:
                return
            self.stopping.set()
            thread.join(timeout=5)
            self.stopping.clear()


_listener = _Listener()


def _listener_start(params: dict) -> None:
    _listener.start(params)


def listener_stop() -> None:
    """Close this process's listening connection (before its database goes away)."""
    _listener.stop()
