"""Model clients: the deterministic local model, and the OpenAI-compatible HTTP client
against a small local HTTP server (no network beyond 127.0.0.1)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runtime.model_client import (
    LocalModel,
    ModelError,
    OpenAICompatibleModel,
    model_client_default,
)


def test_the_local_model_answers_the_same_prompt_the_same_way_and_accounts_for_it():
    model = LocalModel()
    first = model.complete(prompt="Why build cairns?", system="be brief")
    again = model.complete(prompt="Why build cairns?", system="be brief")
    other = model.complete(prompt="Why not build cairns?", system="be brief")
    assert first == again
    assert first.text != other.text
    assert first.prompt_tokens > 0 and first.completion_tokens > 0
    assert first.tokens == first.prompt_tokens + first.completion_tokens
    assert first.cost > 0


class FakeProvider(BaseHTTPRequestHandler):
    """A tiny OpenAI-compatible server: records requests, answers from ``replies``."""

    requests: list[dict] = []
    replies: list[tuple[int, dict]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        status, payload = type(self).replies.pop(0)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


@pytest.fixture
def provider() -> Iterator[str]:
    FakeProvider.requests, FakeProvider.replies = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


ANSWER = {
    "model": "tiny-1",
    "choices": [{"message": {"role": "assistant", "content": "Cairns mark routes."}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 4},
}


def test_the_http_client_speaks_chat_completions_with_the_key_from_its_reference(
    provider, monkeypatch
):
    monkeypatch.setenv("TEST_MODEL_KEY", "k-123")
    FakeProvider.replies.append((200, ANSWER))
    model = OpenAICompatibleModel(
        base_url=provider, model="tiny-1", api_key_ref="env:TEST_MODEL_KEY"
    )
    completion = model.complete(prompt="Why cairns?", system="Be brief.", max_tokens=50)
    assert (completion.text, completion.model) == ("Cairns mark routes.", "tiny-1")
    assert (completion.prompt_tokens, completion.completion_tokens) == (11, 4)
    assert completion.cost > 0
    sent = FakeProvider.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["auth"] == "Bearer k-123"
    assert sent["body"] == {
        "model": "tiny-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Why cairns?"},
        ],
        "max_tokens": 50,
    }


@pytest.mark.parametrize(("status", "retryable"), [(503, True), (429, True), (401, False)])
def test_a_failed_call_says_whether_trying_again_may_help(provider, status, retryable):
    FakeProvider.replies.append((status, {"error": {"message": "no"}}))
    model = OpenAICompatibleModel(base_url=provider, model="tiny-1")
    with pytest.raises(ModelError) as caught:
        model.complete(prompt="Why cairns?")
    assert caught.value.retryable is retryable
    assert f"HTTP {status}" in str(caught.value)


def test_a_missing_key_is_named_by_its_reference_and_nothing_is_sent(provider, monkeypatch):
    monkeypatch.delenv("TEST_MODEL_KEY", raising=False)
    model = OpenAICompatibleModel(
        base_url=provider, model="tiny-1", api_key_ref="env:TEST_MODEL_KEY"
    )
    with pytest.raises(ModelError, match="TEST_MODEL_KEY") as caught:
        model.complete(prompt="Why cairns?")
    assert caught.value.retryable is False
    assert FakeProvider.requests == []


def test_settings_select_the_model_client(settings, provider):
    settings.CAIRN_MODEL_CLIENT = "local"
    assert isinstance(model_client_default(), LocalModel)
    settings.CAIRN_MODEL_CLIENT = "openai"
    settings.CAIRN_MODEL_BASE_URL = provider
    settings.CAIRN_MODEL_NAME = "tiny-1"
    settings.CAIRN_MODEL_API_KEY_REF = ""
    client = model_client_default()
    assert isinstance(client, OpenAICompatibleModel)
    FakeProvider.replies.append((200, ANSWER))
    assert client.complete(prompt="Why cairns?").text == "Cairns mark routes."
