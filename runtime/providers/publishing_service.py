"""A local publishing service: the external system the demo's publish step writes to.

    python -m runtime.providers.publishing_service --port 8765 --state-file var/pub.json

It honours idempotency keys (the same key is the same publication, never a second one),
answers lookups by key or client reference, counts its effects, and misbehaves on demand
so the side-effect protocol can be tested against every kind of ambiguity:

    fail     answer 500 before accepting; nothing is recorded
    drop     record the publication, then close the connection without answering
    timeout  record the publication, then sleep past the client's timeout
    nolookup (lookups) answer 501: the provider cannot tell what happened

A fault is chosen per request with the ``X-Fault`` header, queued for the next perform
requests with ``POST /control/faults {"perform": ["drop", ...], "lookup": "nolookup"}``, or
set for the life of the process with ``--fault`` / ``--lookup-fault``. "Unreachable" is
the client's side: point it at a port nobody listens on.

Long-running jobs: ``POST /jobs`` (header ``Idempotency-Key``; the same key is the same job)
answers 202 with a ``job_id``; ``GET /jobs/{job_id}`` answers ``running`` until the job's
time is up (``--job-seconds``, or the ``X-Job-Seconds`` header of the submission), then
``succeeded`` with the publication it made (exactly one per key) as its ``result``.

Endpoints: ``POST /publications`` (header ``Idempotency-Key``), ``GET
/publications/by-key/{key}``, ``GET /publications?client_reference=…``, ``GET /stats``
(publications per key and per target, what each published, requests seen), ``POST
/control/faults``, ``POST /control/reset``. State is written to the JSON state file after
every change, so a restarted service keeps its publications. Standard library only; no Django.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

PERFORM_FAULTS = ("fail", "drop", "timeout")
LOOKUP_FAULTS = ("nolookup",)
MAX_BODY = 1024 * 1024


class Store:
    """Publications by idempotency key, counters and queued faults, persisted as JSON."""

    def __init__(
        self,
        path: Path | None,
        *,
        fault: str = "",
        lookup_fault: str = "",
        job_seconds: float = 2.0,
    ):
        self.path = path
        self.job_seconds = job_seconds
        self.jobs: dict[str, dict[str, Any]] = {}  # by job id
        self.job_submissions: Counter[str] = Counter()  # submit requests per key
        self.job_polls: Counter[str] = Counter()  # status requests per job id
        self.lock = threading.Lock()
        self.publications: dict[str, dict[str, Any]] = {}
        # What each publication published (the request's payload), by key: what the tests
        # compare with the approved artifact.
        self.payloads: dict[str, Any] = {}
        self.perform_requests: Counter[str] = Counter()
        self.created: Counter[str] = Counter()
        self.fault, self.lookup_fault = fault, lookup_fault
        self.queued: list[str] = []
        if path is not None and path.exists():
            saved = json.loads(path.read_text() or "{}")
            self.publications = saved.get("publications", {})
            self.payloads = saved.get("payloads", {})
            self.perform_requests = Counter(saved.get("perform_requests", {}))
            self.created = Counter(saved.get("created", {}))
            self.jobs = saved.get("jobs", {})
            self.job_submissions = Counter(saved.get("job_submissions", {}))
            self.job_polls = Counter(saved.get("job_polls", {}))

    def _save(self) -> None:
        if self.path is None:
            return
        state = {
            "publications": self.publications,
            "payloads": self.payloads,
            "perform_requests": self.perform_requests,
            "created": self.created,
            "jobs": self.jobs,
            "job_submissions": self.job_submissions,
            "job_polls": self.job_polls,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".pub-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    def next_fault(self, requested: str) -> str:
        with self.lock:
            if requested:
                return requested
            if self.queued:
                return self.queued.pop(0)
            return self.fault

    def publish(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.lock:
            self.perform_requests[key] += 1
            existing = self.publications.get(key)
            if existing is not None:
                self._save()
                if existing["request_sha256"] != digest:
                    return 409, {
                        "error": "idempotency_key_reused",
                        "detail": f"key {key} was used for a different publication",
                    }
                return 200, existing
            publication = {
                "id": f"pub_{uuid.uuid4().hex[:16]}",
                "idempotency_key": key,
                "status": "published",
                "target": str(body.get("target", "")),
                "client_reference": str(body.get("client_reference", "")),
                "request_sha256": digest,
                "url": f"/published/{uuid.uuid4().hex[:8]}",
                "created_at": datetime.now(UTC).isoformat(),
            }
            self.publications[key] = publication
            self.payloads[key] = body.get("payload")
            self.created[key] += 1
            self._save()
            return 201, publication

    def submit_job(
        self, key: str, body: dict[str, Any], seconds: float | None
    ) -> tuple[int, dict[str, Any]]:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.lock:
            self.job_submissions[key] += 1
            existing = next((j for j in self.jobs.values() if j["idempotency_key"] == key), None)
            if existing is not None:
                self._save()
                if existing["request_sha256"] != digest:
                    return 409, {
                        "error": "idempotency_key_reused",
                        "detail": f"key {key} was used for a different job",
                    }
                return 200, self._job_view(existing)
            job = {
                "job_id": f"job_{uuid.uuid4().hex[:16]}",
                "idempotency_key": key,
                "status": "running",
                "request_sha256": digest,
                "body": body,
                "started": time.time(),
                "seconds": self.job_seconds if seconds is None else seconds,
                "result": None,
            }
            self.jobs[job["job_id"]] = job
            self._save()
            return 202, self._job_view(job)

    def _job_view(self, job: dict[str, Any]) -> dict[str, Any]:
        return {
            "job_id": job["job_id"],
            "idempotency_key": job["idempotency_key"],
            "status": job["status"],
            "result": job["result"],
        }

    def job_status(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return None
            self.job_polls[job_id] += 1
            finished = time.time() >= job["started"] + job["seconds"]
            ready = job["status"] == "running" and finished
        if ready:
            # The job's effect: one publication under the job's key, whoever polls first.
            _status, publication = self.publish(job["idempotency_key"], job["body"])
            with self.lock:
                job["status"], job["result"] = "succeeded", publication
        with self.lock:
            self._save()
            return self._job_view(job)

    def by_reference(self, reference: str) -> dict[str, Any] | None:
        with self.lock:
            return next(
                (p for p in self.publications.values() if p["client_reference"] == reference),
                None,
            )

    def stats(self) -> dict[str, Any]:
        with self.lock:
            by_target = Counter(p["target"] for p in self.publications.values())
            return {
                "publications": len(self.publications),
                "by_key": dict(self.created),
                "by_target": dict(by_target),
                "ids": {key: p["id"] for key, p in self.publications.items()},
                "payloads": dict(self.payloads),
                "perform_requests": dict(self.perform_requests),
                "jobs": len(self.jobs),
                "job_submissions": dict(self.job_submissions),
                "job_polls": dict(self.job_polls),
            }

    def set_faults(self, spec: dict[str, Any]) -> None:
        perform = spec.get("perform", [])
        perform = [perform] if isinstance(perform, str) else list(perform)
        if any(mode not in PERFORM_FAULTS for mode in perform):
            raise ValueError(f"perform faults are {', '.join(PERFORM_FAULTS)}")
        lookup = spec.get("lookup", self.lookup_fault)
        if lookup not in ("", *LOOKUP_FAULTS):
            raise ValueError("the lookup fault is 'nolookup' or ''")
        with self.lock:
            self.queued = perform
            self.lookup_fault = lookup
            if "default" in spec:
                self.fault = spec["default"] or ""

    def reset(self) -> None:
        with self.lock:
            self.publications.clear()
            self.payloads.clear()
            self.perform_requests.clear()
            self.created.clear()
            self.jobs.clear()
            self.job_submissions.clear()
            self.job_polls.clear()
            self.queued = []
            self._save()


class Handler(BaseHTTPRequestHandler):
    server: PublishingServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _authorized(self) -> bool:
        token = self.server.token
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            self._send(401, {"error": "unauthorized", "detail": "a valid bearer token is required"})
            return False
        return True

    def _keyed_body(self) -> tuple[str, dict[str, Any]] | None:
        """The Idempotency-Key and JSON body of a publish or job submission, or None once the
        error is sent; both endpoints refuse a bad body before a missing key, in that order."""
        key = self.headers.get("Idempotency-Key", "")
        body = self._body()
        if body is None:
            return None
        if not key:
            self._send(400, {"error": "missing_key", "detail": "send an Idempotency-Key header"})
            return None
        return key, body

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(413, {"error": "too_large"})
            return None
        try:
            value = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": "bad_json", "detail": "the body is not JSON"})
            return None
        if not isinstance(value, dict):
            self._send(400, {"error": "bad_json", "detail": "the body must be an object"})
            return None
        return value

    def _drop(self) -> None:
        # Accepted and recorded, but the client never hears about it.
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path == "/control/faults":
            body = self._body()
            if body is None:
                return
            try:
                self.server.store.set_faults(body)
            except ValueError as exc:
                self._send(400, {"error": "bad_fault", "detail": str(exc)})
                return
            self._send(200, {"ok": True})
            return
        if path == "/control/reset":
            self.server.store.reset()
            self._send(200, {"ok": True})
            return
        if path not in ("/publications", "/jobs"):
            self._send(404, {"error": "no_such_endpoint"})
            return
        if not self._authorized():
            return
        if path == "/jobs":
            self._submit_job()
            return
        keyed = self._keyed_body()
        if keyed is None:
            return
        key, body = keyed
        requested = self.headers.get("X-Fault", "")
        if requested and requested not in PERFORM_FAULTS:
            self._send(400, {"error": "bad_fault", "detail": f"unknown fault {requested}"})
            return
        fault = self.server.store.next_fault(requested)
        if fault == "fail":
            self._send(500, {"error": "unavailable", "detail": "failed before accepting"})
            return
        status, answer = self.server.store.publish(key, body)
        if fault == "drop":
            self._drop()
            return
        if fault == "timeout":
            time.sleep(self.server.timeout_sleep)
        try:
            self._send(status, answer)
        except OSError:
            pass  # the client gave up waiting: that is the point of this fault

    def _submit_job(self) -> None:
        keyed = self._keyed_body()
        if keyed is None:
            return
        key, body = keyed
        try:
            seconds = (
                float(self.headers["X-Job-Seconds"]) if "X-Job-Seconds" in self.headers else None
            )
        except ValueError:
            self._send(400, {"error": "bad_seconds", "detail": "X-Job-Seconds is a number"})
            return
        status, answer = self.server.store.submit_job(key, body, seconds)
        self._send(status, answer)

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        if parts.path.startswith("/jobs/"):
            if not self._authorized():
                return
            job = self.server.store.job_status(unquote(parts.path.removeprefix("/jobs/")))
            if job is None:
                self._send(404, {"found": False, "detail": "no job with that id"})
            else:
                self._send(200, job)
            return
        if parts.path == "/stats":
            self._send(200, self.server.store.stats())
            return
        if parts.path == "/health":
            self._send(200, {"ok": True})
            return
        if not parts.path.startswith("/publications"):
            self._send(404, {"error": "no_such_endpoint"})
            return
        if not self._authorized():
            return
        store = self.server.store
        if "nolookup" in (self.headers.get("X-Fault", ""), store.lookup_fault):
            self._send(501, {"error": "no_lookup", "detail": "this provider cannot look up"})
            return
        if parts.path.startswith("/publications/by-key/"):
            key = unquote(parts.path.removeprefix("/publications/by-key/"))
            with store.lock:
                found = store.publications.get(key)
        elif parts.path == "/publications":
            reference = parse_qs(parts.query).get("client_reference", [""])[0]
            found = store.by_reference(reference) if reference else None
        else:
            self._send(404, {"error": "no_such_endpoint"})
            return
        if found is None:
            self._send(404, {"found": False, "detail": "no publication with that key"})
        else:
            self._send(200, found)


class PublishingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        store: Store,
        *,
        token: str = "",
        timeout_sleep: float = 30.0,
        verbose: bool = False,
    ):
        super().__init__(address, Handler)
        self.store, self.token = store, token
        self.timeout_sleep, self.verbose = timeout_sleep, verbose


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--state-file", type=Path, default=None)
    parser.add_argument("--fault", choices=PERFORM_FAULTS, default="")
    parser.add_argument("--lookup-fault", choices=LOOKUP_FAULTS, default="")
    parser.add_argument("--timeout-sleep", type=float, default=30.0)
    parser.add_argument(
        "--job-seconds", type=float, default=2.0, help="how long a submitted job runs"
    )
    parser.add_argument(
        "--token-env", default="", help="require 'Bearer $NAME' from this environment variable"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    token = os.environ.get(args.token_env, "") if args.token_env else ""
    if args.token_env and not token:
        parser.error(f"the environment variable {args.token_env} is not set")
    store = Store(
        args.state_file,
        fault=args.fault,
        lookup_fault=args.lookup_fault,
        job_seconds=args.job_seconds,
    )
    server = PublishingServer(
        (args.host, args.port),
        store,
        token=token,
        timeout_sleep=args.timeout_sleep,
        verbose=args.verbose,
    )
    host, port = server.server_address[:2]
    # Tests read this line to learn the port.
    print(f"publishing service listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
