"""Integration hook: other integrations connect here. Cairn's own reviewer notifications
(email, chat) go through the outbox instead (``approvals.notify``).

Both signals are sent after the transaction that wrote the request or decision commits, so
a receiver always finds the rows it is told about. A receiver that raises is logged and
ignored: a notification must never undo or block an approval.

- ``approval_requested(sender=ApprovalRequest, request=ApprovalRequest)``
- ``approval_decided(sender=ApprovalRequest, request=ApprovalRequest, decision=ApprovalDecision)``
"""

from __future__ import annotations

from django.dispatch import Signal

approval_requested = Signal()
approval_decided = Signal()
