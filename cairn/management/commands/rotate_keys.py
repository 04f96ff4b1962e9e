"""Rotate every sealed payload to the active key: the store's rows, then each app that
keeps sealed rows of its own. It lives in the project because it spans the apps."""

from django.core.management.base import BaseCommand

from approvals.keys import approvals_keys_rotate
from checkpoints.services.keys import keys_rotate
from langgraph_store.keys import langgraph_keys_rotate


class Command(BaseCommand):
    help = "Re-encrypt every payload under the active key (the first in CAIRN_ENCRYPTION_KEYS)."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=500)

    def handle(self, *args, batch_size, **options):
        def progress(kind: str, done: int) -> None:
            self.stdout.write(f"  {kind}: {done} re-encrypted")

        totals = keys_rotate(batch_size=batch_size, progress=progress)
        totals["langgraph"] = langgraph_keys_rotate(batch_size=batch_size, progress=progress)
        totals["chat URLs"] = approvals_keys_rotate(batch_size=batch_size, progress=progress)
        summary = ", ".join(f"{kind} {count}" for kind, count in totals.items())
        self.stdout.write(self.style.SUCCESS(f"Rotation complete: {summary}."))
