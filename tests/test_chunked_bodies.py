"""A request body sent with ``Transfer-Encoding: chunked`` is read, within the size limit,
or refused with 411; it is never taken for an empty body. Django's test client cannot send
one, so these talk HTTP to real servers: gunicorn (which decodes the chunks for the
application) and Django's own server (which does not, and so gets 411)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from checkpoints.models import Artifact, Run
from checkpoints.services.artifacts import artifact_read
from tenants.services import Actor, token_issue
from tests.web_server import web_server  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def pieces(data: bytes, size: int = 4096) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def send_chunked(url: str, path: str, data: bytes, headers: dict) -> tuple[int, dict]:
    """POST ``data`` in chunks of 4 KiB with http.client, as a streaming client does."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        try:
            connection.request(
                "POST",
                path,
                body=pieces(data),
                headers={**headers, "Transfer-Encoding": "chunked"},
                encode_chunked=True,
            )
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered before the client finished: read its answer
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.fixture
def bearer(acme, bob) -> dict[str, str]:  # noqa: ANN001
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    return {"Authorization": f"Bearer {secret}"}


def test_a_chunked_artifact_upload_stores_exactly_the_bytes_sent(web_server, bearer, acme):  # noqa: ANN001, F811
    server = web_server()
    data = os.urandom(300_000)
    status, body = send_chunked(
        server.url,
        "/api/v1/artifacts",
        data,
        {**bearer, "Content-Type": "application/octet-stream", "X-Artifact-Kind": "source"},
    )
    assert status == 201, body
    assert body["sha256"] == hashlib.sha256(data).hexdigest() != hashlib.sha256(b"").hexdigest()
    artifact = Artifact.objects.get(pk=body["id"])
    assert artifact.size == len(data)
    _, content = artifact_read(tenant=acme, artifact_id=artifact.pk, actor=Actor.system("t"))
    assert content == data


def test_a_chunked_upload_past_the_limit_is_a_413_and_stores_nothing(web_server, bearer):  # noqa: ANN001, F811
    server = web_server()
    data = b"x" * (settings.CAIRN_MAX_ARTIFACT_BYTES + 1024 * 1024)  # 11 MB
    status, body = send_chunked(
        server.url, "/api/v1/artifacts", data, {**bearer, "Content-Type": "text/plain"}
    )
    assert status == 413, body
    assert (
        body["code"] == "payload_too_large"
        and str(settings.CAIRN_MAX_ARTIFACT_BYTES) in (body["detail"])
    )
    assert not Artifact.objects.exists()


def test_a_chunked_json_body_is_read_and_held_to_the_json_limit(web_server, bearer, workflow):  # noqa: ANN001, F811
    server = web_server()
    run = {"workflow_type": "research", "execution": "external", "inputs": {"q": "chunked"}}
    status, body = send_chunked(
        server.url,
        "/api/v1/runs",
        json.dumps(run).encode(),
        {**bearer, "Content-Type": "application/json"},
    )
    assert status == 201, body
    assert Run.objects.get(pk=body["id"]).workflow_type == "research"
    big = {**run, "inputs": {"q": "x" * (settings.CAIRN_MAX_REQUEST_BYTES + 10)}}
    status, body = send_chunked(
        server.url,
        "/api/v1/runs",
        json.dumps(big).encode(),
        {**bearer, "Content-Type": "application/json"},
    )
    assert status == 413 and body["code"] == "payload_too_large", body
    assert Run.objects.count() == 1


def test_a_server_that_cannot_read_chunks_answers_411_and_stores_nothing(live_server, bearer):  # noqa: ANN001
    """Django's own server (runserver, live_server) hands the application no chunked body."""
    status, body = send_chunked(
        live_server.url, "/api/v1/artifacts", b"content the server never sees", bearer
    )
    assert status == 411, body
    assert body["code"] == "length_required" and "Content-Length" in body["detail"]
    assert not Artifact.objects.exists()


def raw_exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` as it is (no client fixes it up) and read the answer to its end."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)  # a truncated body ends here
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


MALFORMED = {
    "not hex": b"zz\r\nhello\r\n0\r\n\r\n",
    "truncated chunk": b"10\r\nonly five",
    "no terminator": b"5\r\nhelloXX0\r\n\r\n",
    "no last chunk": b"5\r\nhello\r\n",
    "negative size": b"-5\r\nhello\r\n0\r\n\r\n",
}
CUT_SHORT = {"truncated chunk", "no last chunk"}


@pytest.mark.parametrize("anonymous", [True, False])
def test_a_malformed_chunked_body_is_a_400_never_a_500(web_server, bearer, anonymous):  # noqa: ANN001, F811
    server = web_server()
    auth = b"" if anonymous else f"Authorization: {bearer['Authorization']}\r\n".encode()
    for what, body in MALFORMED.items():
        for path in (b"/api/v1/runs", b"/api/v1/artifacts", b"/login/"):
            answer = raw_exchange(
                server.url,
                b"POST "
                + path
                + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + auth
                + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n" + body,
            )
            if what in CUT_SHORT and not answer:
                # The client ended its stream mid-body: uvicorn closes the connection (it
                # does not keep a half-closed one), so nobody is left to answer; the
                # application read the body as cut short (logged below), never as whole.
                continue
            status = int(answer.split(b" ", 2)[1])
            assert status == 400, (what, path, answer[:300])
    assert Run.objects.count() == 0
    log = server.log()
    assert "Traceback" not in log and '"level": "ERROR"' not in log, log[-3000:]
    assert '"error": "ClientDisconnected"' in log, log[-3000:]


def test_a_body_cut_short_of_its_content_length_is_never_a_500_nor_stored(web_server, bearer):  # noqa: ANN001, F811
    # The client declares 1,000 bytes, sends seven and ends its stream: whatever the route
    # (JSON, an artifact's raw bytes, a form), the application is told the body was cut
    # short (a 400, to nobody), never handed seven bytes as the whole body, never a 500.
    server = web_server()
    for path in (b"/api/v1/runs", b"/api/v1/artifacts", b"/login/"):
        raw_exchange(
            server.url,
            b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: {bearer['Authorization']}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            + b'{"a": 1',
        )  # fmt: skip
    assert Run.objects.count() == 0 and Artifact.objects.count() == 0
    log = server.log()
    assert "Traceback" not in log and '"level": "ERROR"' not in log, log[-3000:]
