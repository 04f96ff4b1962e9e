"""A real SMTP server on loopback (aiosmtpd) for the notification tests: ``smtp`` starts
one and points Django's SMTP backend at it; ``smtp_server`` only starts one (for worker
subprocesses, which are told its port through their environment)."""

from __future__ import annotations

import email
import socket
from collections.abc import Iterator

import pytest
from aiosmtpd.controller import Controller

PUBLIC_URL = "https://cairn.example.org"


class Inbox:
    """What the SMTP server accepted: (recipients, parsed message)."""

    def __init__(self) -> None:
        self.port = 0
        self.messages: list[tuple[list[str], email.message.Message]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, ANN201, N802
        self.messages.append(
            (list(envelope.rcpt_tos), email.message_from_bytes(envelope.original_content))
        )
        return "250 OK"

    def to(self, address: str) -> list[email.message.Message]:
        return [m for rcpt, m in self.messages if address in rcpt]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smtp_worker_env(inbox: Inbox) -> dict[str, str]:
    """The environment of a worker subprocess that sends its email to ``inbox``."""
    return {
        "CAIRN_EMAIL_HOST": "127.0.0.1",
        "CAIRN_EMAIL_PORT": str(inbox.port),
        "CAIRN_PUBLIC_URL": PUBLIC_URL,
    }


@pytest.fixture
def smtp_server() -> Iterator[Inbox]:
    """A real SMTP server on loopback; its port is ``inbox.port``."""
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    inbox.port = controller.port
    yield inbox
    controller.stop()


@pytest.fixture
def smtp(settings, smtp_server) -> Iterator[Inbox]:  # noqa: ANN001
    """The SMTP server, and Django's SMTP backend in this process pointed at it."""
    inbox = smtp_server
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", inbox.port
    settings.CAIRN_EMAIL_NOTIFICATIONS = True
    settings.CAIRN_PUBLIC_URL = PUBLIC_URL
    yield inbox
