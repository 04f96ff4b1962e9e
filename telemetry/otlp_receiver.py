"""A loopback OTLP/HTTP trace receiver: what a collector sees of Cairn, without a collector.

It accepts ``POST /v1/traces`` (protobuf, gzip or not) as Jaeger, Tempo or a collector
would, decodes every span with ``opentelemetry-proto`` and keeps it as a plain dict. The
tracing tests and ``make bench`` use it; a developer can run it to see what Cairn exports::

    .venv/bin/python -m telemetry.otlp_receiver --port 4318 --print
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 .venv/bin/python manage.py cairn_up

``GET /spans`` answers every span received so far as JSON, ``GET /stats`` their count.
Nothing leaves the machine: it binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS = {0: "unset", 1: "ok", 2: "error"}


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as the Python value it holds."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {item.key: any_value(item.value) for item in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: any_value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[dict[str, Any]]:
    """Every span of one ExportTraceServiceRequest, as dicts with hex ids."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": KINDS.get(span.kind, str(span.kind)),
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": _attributes(span.attributes),
                        "events": [
                            {"name": event.name, "attributes": _attributes(event.attributes)}
                            for event in span.events
                        ],
                        "links": [
                            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                            for link in span.links
                        ],
                        "status": STATUS.get(span.status.code, str(span.status.code)),
                        "scope": scope_spans.scope.name,
                        "resource": resource,
                    }
                )
    return spans


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` serves on 127.0.0.1 (a free port unless given) in
    a thread; ``receiver.endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT names."""

    def __init__(self, port: int = 0, *, echo: bool = False) -> None:
        self._lock = threading.Lock()
        self._spans: list[dict[str, Any]] = []
        self.requests = 0
        self.echo = echo
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: one line per export is noise
                pass

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - the http.server protocol
                if self.path.rstrip("/") != "/v1/traces":
                    self._answer(404, b"only /v1/traces\n", "text/plain")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                try:
                    spans = decode(body)
                except Exception:  # noqa: BLE001 - a malformed export is the sender's problem
                    self._answer(400, b"not an ExportTraceServiceRequest\n", "text/plain")
                    return
                receiver._received(spans)
                self._answer(
                    200,
                    ExportTraceServiceResponse().SerializeToString(),
                    "application/x-protobuf",
                )

            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                if self.path == "/spans":
                    body = json.dumps(receiver.spans()).encode()
                elif self.path == "/stats":
                    body = json.dumps(
                        {"spans": len(receiver.spans()), "requests": receiver.requests}
                    ).encode()
                else:
                    self._answer(404, b"GET /spans or /stats\n", "text/plain")
                    return
                self._answer(200, body, "application/json")

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _received(self, spans: list[dict[str, Any]]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1
        if self.echo:
            for span in spans:
                print(json.dumps(span), flush=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--print", action="store_true", help="print each span as a JSON line")
    options = parser.parse_args(argv)
    receiver = OtlpReceiver(options.port, echo=options.print).start()
    print(f"OTLP/HTTP receiver listening on 127.0.0.1:{receiver.port}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
