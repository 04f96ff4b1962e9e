"""Child process of the key-rotation crash tests: rotate keys, SIGKILL itself at one point.

``python -m tests.rotation_crash <point>`` runs ``keys_rotate`` with the real code, wrapped
so the process kills itself (SIGKILL: no cleanup, no rollback handler, no on_commit) at:

- ``during_write``: halfway through uploading the resealed object;
- ``after_write``: the new object is complete, the row still names the old one;
- ``before_commit``: the row is switched inside the transaction, not yet committed;
- ``after_commit``: the switch is committed, the old object not yet deleted.
"""

from __future__ import annotations

import os
import signal
import sys


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(point: str) -> None:
    import django

    django.setup()
    from django.db import transaction

    from checkpoints.services import artifacts
    from checkpoints.services.keys import keys_rotate

    if point == "during_write":
        original_file = artifacts.File

        class DyingFile(original_file):
            def read(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
                if getattr(self, "_served", 0) > 64 * 1024:
                    die()
                data = super().read(*args, **kwargs)
                self._served = getattr(self, "_served", 0) + len(data)
                return data

            def chunks(self, chunk_size=None):  # noqa: ANN001, ANN201
                for index, chunk in enumerate(super().chunks(16 * 1024)):
                    if index == 3:
                        die()
                    yield chunk

        artifacts.File = DyingFile
    elif point == "after_write":
        original_write = artifacts.artifact_object_write

        def write_then_die(**kwargs):  # noqa: ANN003, ANN202
            original_write(**kwargs)
            die()

        artifacts.artifact_object_write = write_then_die
    elif point == "before_commit":
        transaction.on_commit = lambda *args, **kwargs: die()
    elif point == "after_commit":
        artifacts._object_delete_quietly = lambda name: die()
    else:
        raise SystemExit(f"unknown crash point {point}")
    keys_rotate(batch_size=10)
    print("rotation finished without reaching the crash point")
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
