"""Create or show the deployment's evidence signing key (docs/operations.md, "Signed
evidence")."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from approvals.signing import evidence_key_create, evidence_signing_key
from cairn.errors import SigningKeyUnavailable


class Command(BaseCommand):
    help = (
        "Print the public key that verifies evidence bundles; --create first writes a new "
        "private key to CAIRN_EVIDENCE_KEY_FILE when none is there."
    )

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument(
            "--create", action="store_true", help="write a new key file if there is none"
        )

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        path = Path(settings.CAIRN_EVIDENCE_KEY_FILE)
        if options["create"]:
            made = evidence_key_create(path)
            self.stdout.write(f"{'Created' if made else 'Kept the existing'} key file {path}")
        try:
            key = evidence_signing_key()
        except SigningKeyUnavailable as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"key id {key.key_id}")
        self.stdout.write(key.public_pem.rstrip())
