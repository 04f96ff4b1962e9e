"""Every request Cairn makes to a tenant-chosen address goes through ``cairn.outbound``:
internal destinations are refused in every spelling, when the webhook is set (400) and
again at each delivery; the request goes to the address that was checked; redirects are
not followed; a URL with a password is refused before it can be logged."""

from __future__ import annotations

import json
import socket

import pytest

from cairn import outbound
from checkpoints.models import RunnerWebhook, WebhookDelivery
from runtime.providers.http import HttpProvider
from runtime.services.webhooks import webhook_url_seal, webhooks_deliver
from tenants.models import AuditEvent
from tests.approvals_support import move

# The spellings an adversarial pass got accepted, and their relatives: loopback, the
# unspecified address, link-local metadata, private, shared, multicast, IPv4 inside IPv6.
INTERNAL = [
    "http://127.0.0.1:6379/",
    "http://localhost/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:7f00:1]/hook",
    "http://[::127.0.0.1]/hook",
    "http://[64:ff9b::7f00:1]/hook",
    "http://[2002:7f00:1::]/hook",
    "http://0.0.0.0/hook",
    "http://[::]/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata.google.internal./computeMetadata/v1/",
    "http://2130706433/hook",
    "http://0x7f.1/hook",
    "http://0x7f000001/hook",
    "http://0177.0.0.1/hook",
    "http://127.1/hook",
    "http://10.0.0.1/hook",
    "http://172.16.5.4/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://224.0.0.1/hook",
    "http://[fe80::1]/hook",
    "http://[fd00:ec2::254]/hook",
    "http://[ff02::1]/hook",
    "https://user:s3cr3tpw@127.0.0.1/hook",
    "http://user:s3cr3tpw@example.org/hook",
    "ftp://example.org/hook",
    "http:///hook",
]


@pytest.fixture
def nothing_internal(settings):  # noqa: ANN001
    """The production default: no internal destination is allowed."""
    settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL = []


@pytest.fixture
def connections(monkeypatch):  # noqa: ANN001
    """Every connection the outbound path opens, by address; anything but loopback fails
    the test before a packet leaves (these tests never send traffic off this machine)."""
    opened: list[tuple[str, int]] = []
    real = socket.create_connection

    def create_connection(address, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        opened.append(address)
        assert address[0] in ("127.0.0.1", "::1"), f"outbound connection to {address}"
        return real(address, *args, **kwargs)

    monkeypatch.setattr(outbound.socket, "create_connection", create_connection)
    return opened


@pytest.mark.django_db
@pytest.mark.parametrize("url", INTERNAL)
def test_setting_a_webhook_to_an_internal_address_is_a_400_with_a_sentence(
    api_as, alice, acme, nothing_internal, url
):  # noqa: ANN001
    answer = api_as(alice, acme).put("/api/v1/webhook", {"url": url}, format="json")
    assert answer.status_code == 400, answer.json()
    body = answer.json()
    assert body["code"] == "invalid_request" and "url" in body["fields"]
    assert body["detail"].endswith(".") and "s3cr3tpw" not in answer.content.decode()
    assert not RunnerWebhook.objects.exists()
    assert not AuditEvent.objects.filter(action="webhook.set").exists()


def _sealed(tenant, url: str) -> str:  # noqa: ANN001
    return webhook_url_seal(tenant_id=tenant.pk, url=url)


@pytest.mark.django_db(transaction=True)
def test_a_delivery_to_an_internal_address_is_refused_again_without_connecting(
    api_as, alice, acme, run, receivers, settings, connections
):  # noqa: ANN001
    receiver = receivers()
    settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL = [f"127.0.0.1:{receiver.port}"]
    put = api_as(alice, acme).put("/api/v1/webhook", {"url": receiver.url}, format="json")
    assert put.status_code == 200, put.json()
    move(run, "draft_answer")
    for url in INTERNAL:
        # Set before this check existed, or allowed by a setting that changed since.
        RunnerWebhook.objects.filter(tenant=acme).update(url_sealed=_sealed(acme, url))
        WebhookDelivery.objects.update(next_attempt_at="2000-01-01T00:00:00Z")
        assert webhooks_deliver() == 0, url
        delivery = WebhookDelivery.objects.get()
        assert delivery.last_error.startswith("not sent:"), (url, delivery.last_error)
        assert "s3cr3tpw" not in delivery.last_error
    assert connections == [] and receiver.seen == []
    RunnerWebhook.objects.filter(tenant=acme).update(url_sealed=_sealed(acme, receiver.url))
    WebhookDelivery.objects.update(next_attempt_at="2000-01-01T00:00:00Z")
    assert webhooks_deliver() == 1  # the same delivery, once the URL is an allowed one
    assert connections == [("127.0.0.1", receiver.port)]


@pytest.mark.django_db(transaction=True)
def test_a_redirect_is_answered_as_it_is_never_followed(
    api_as, alice, acme, run, receivers, connections
):  # noqa: ANN001
    inside = receivers()
    redirecting = receivers(redirect_to=inside.url)
    assert (
        api_as(alice, acme)
        .put("/api/v1/webhook", {"url": redirecting.url}, format="json")
        .status_code
        == 200
    )
    move(run, "draft_answer")
    assert webhooks_deliver() == 0
    assert [method for method, *_ in redirecting.seen] == ["POST"]
    assert inside.seen == []  # neither a POST nor the GET urllib turned the 302 into
    assert "302 (redirects are not followed)" in WebhookDelivery.objects.get().last_error


@pytest.mark.django_db(transaction=True)
def test_the_request_goes_to_the_address_that_was_checked_whatever_dns_says_next(
    api_as, alice, acme, run, receivers, settings, monkeypatch, connections
):  # noqa: ANN001
    receiver = receivers()
    settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL = [f"127.0.0.1:{receiver.port}"]
    answers = iter([["127.0.0.1"], ["127.0.0.1"], ["127.0.0.2"], ["127.0.0.2"]])
    asked: list[str] = []

    def rebinding_dns(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    monkeypatch.setattr(outbound, "resolve", rebinding_dns)
    url = f"http://hooks.runner.example:{receiver.port}/hooks/cairn"
    put = api_as(alice, acme).put("/api/v1/webhook", {"url": url}, format="json")
    assert put.status_code == 200
    move(run, "draft_answer")
    assert webhooks_deliver() == 1
    # One resolution per use, and the connection went to the address it returned.
    assert asked == ["hooks.runner.example", "hooks.runner.example"]
    assert connections == [("127.0.0.1", receiver.port)]
    assert receiver.seen[0][2]["Host"] == f"hooks.runner.example:{receiver.port}"
    # Now the name resolves to an address that is not allowed: refused, never connected.
    move(run, "review")
    assert webhooks_deliver() == 0
    assert "127.0.0.2" in WebhookDelivery.objects.filter(delivered_at__isnull=True).get().last_error
    assert len(connections) == 1


def test_an_allowed_internal_destination_is_named_by_host_port_network_or_name(settings):  # noqa: ANN001
    settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL = ["127.0.0.1:8765", "10.1.0.0/16", "[::1]:9000"]
    assert outbound.destination_check("http://127.0.0.1:8765/x").address == "127.0.0.1"
    assert outbound.destination_check("http://[::1]:9000/").address == "::1"
    assert outbound.destination_check("http://10.1.2.3/").address == "10.1.2.3"
    for refused in ("http://127.0.0.1:8766/", "http://[::1]:9001/", "http://10.2.0.1/"):
        with pytest.raises(outbound.DestinationRefused):
            outbound.destination_check(refused)


def test_a_global_address_is_a_destination():
    assert outbound.address_problem(outbound.ipaddress.ip_address("93.184.215.14")) is None
    assert outbound.address_problem(outbound.ipaddress.ip_address("2606:4700::1111")) is None


def test_the_provider_adapter_goes_through_the_same_path(settings, receivers, connections):  # noqa: ANN001
    settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL = []
    provider = HttpProvider(name="tenant-http", base_url="http://169.254.169.254")
    result = provider.lookup(key="k-1")
    assert result.outcome == "unavailable" and "link-local" in result.reason
    inside = receivers()
    settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL = ["127.0.0.1"]
    redirecting = receivers(redirect_to=inside.url)
    HttpProvider(name="tenant-http", base_url=redirecting.url.removesuffix("/hooks/cairn")).lookup(
        key="k-1"
    )
    assert len(redirecting.seen) == 1 and inside.seen == []
    assert json.dumps(connections)  # only loopback was ever connected to
