"""The embedded default's broker: kombu's filesystem transport, with whole messages only.

kombu's own ``_put`` creates the message file under its final name and then writes it, while
``_get`` takes any file with a matching name without a lock: a worker polling at that moment
reads an empty file, fails to decode it, and stops ("Unrecoverable error: JSONDecodeError").
Here each message is written under a name no consumer matches (it starts with a dot) and
renamed into place, which POSIX makes atomic within one folder: a consumer sees the whole
message or none of it. Selected by ``CELERY_BROKER_TRANSPORT`` (cairn/settings.py) when
``CELERY_BROKER_URL`` is ``filesystem://``.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):  # noqa: ANN001, ANN003, ANN202
        """Put ``payload`` onto ``queue``: written aside, then renamed into place."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb", buffering=0) as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
