"""The in-memory registry of workflows declared in code, and their storage in the database.

Declaring a ``Workflow`` adds it to ``runtime.definition.declared``; the modules named by
``CAIRN_WORKFLOW_MODULES`` are imported the first time the registry is read (by a worker, a
command or run creation).
Nothing here writes to the database at import time: ``workflows_sync`` does, when called.
"""

from __future__ import annotations

import importlib
import logging
import threading

from django.conf import settings
from django.db import transaction

from cairn.errors import DefinitionConflict
from checkpoints.models import WorkflowDefinition
from checkpoints.services.workflows import workflow_register
from runtime.definition import Workflow, declared

log = logging.getLogger("cairn.runtime")

_loaded = False
_lock = threading.Lock()


def _load_modules() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        for name in settings.CAIRN_WORKFLOW_MODULES:
            importlib.import_module(name)
        _loaded = True


def workflow_code(workflow_type: str, version: str) -> Workflow | None:
    """The code of a workflow version, or None when no loaded module declares it."""
    _load_modules()
    return declared.get((workflow_type, version))


def workflows_declared() -> list[Workflow]:
    _load_modules()
    return sorted(declared.values(), key=lambda w: (w.workflow_type, w.version))


def workflows_sync() -> list[tuple[Workflow, str]]:
    """Store every declared workflow's definition (tenant-less, has_code). Returns
    (workflow, outcome) with outcome ``created``, ``unchanged`` or a sentence saying why it
    could not be stored (a different definition under the same version). Each registration
    is its own transaction; one conflict does not stop the others."""
    results: list[tuple[Workflow, str]] = []
    for workflow in workflows_declared():
        results.append((workflow, workflow_sync_one(workflow)))
    return results


def workflow_sync_one(workflow: Workflow) -> str:
    try:
        with transaction.atomic():
            row, created = workflow_register(
                tenant=None,
                workflow_type=workflow.workflow_type,
                version=workflow.version,
                definition=workflow.definition(),
                has_code=True,
            )
            if not created and not row.has_code:
                WorkflowDefinition.objects.filter(pk=row.pk).update(has_code=True)
    except DefinitionConflict as exc:
        log.warning("workflow not synced", extra={"workflow": str(workflow), "why": exc.detail})
        return exc.detail
    return "created" if created else "unchanged"


def workflow_ensure_registered(workflow_type: str, version: str | None) -> bool:
    """Register the code workflow named (newest declared version when ``version`` is None)
    if code declares it. Returns whether one was registered or already stored."""
    candidates = [
        w
        for w in workflows_declared()
        if w.workflow_type == workflow_type and (version is None or w.version == version)
    ]
    if not candidates:
        return False
    return workflow_sync_one(candidates[-1]) in {"created", "unchanged"}
