"""Artifact files that no row names: what a web server killed mid-upload leaves behind.

``artifact_store`` writes the file before the row (so a row never names missing content);
a process killed in between, or while the file is still being written, leaves an
encrypted file, complete or partial, that nothing will ever read. ``sweep_orphans`` lists
the storage under ``artifacts/`` and removes each file that is older than
``ORPHAN_MIN_AGE`` and that no ``Artifact`` row names. The age rule keeps it off uploads
in flight and off key rotation's new files (written just before the row points at them).

It goes through Django's storage API only (``listdir``, ``get_modified_time``,
``delete``), so it works the same on the filesystem and on any ``STORAGES`` backend that
implements them (S3 through django-storages does)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.files.storage import default_storage
from django.utils import timezone

from checkpoints.models import Artifact
from tenants.models import Tenant

log = logging.getLogger("cairn.retention")

ROOT = "artifacts"
ORPHAN_MIN_AGE = timedelta(hours=1)
BATCH = 500


@dataclass
class OrphanReport:
    dry_run: bool
    files: list[str] = field(default_factory=list)  # removed, or with dry_run to be removed
    kept_young: int = 0  # orphans not old enough yet (perhaps still being uploaded)


def _files(folder: str) -> Iterator[str]:
    try:
        folders, files = default_storage.listdir(folder)
    except FileNotFoundError:
        return
    for name in files:
        yield f"{folder}/{name}"
    for sub in folders:
        yield from _files(f"{folder}/{sub}")


def _batches(names: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for name in names:
        batch.append(name)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def sweep_orphans(
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    min_age: timedelta = ORPHAN_MIN_AGE,
    tenant: Tenant | None = None,
) -> OrphanReport:
    """Remove artifact files older than ``min_age`` that no artifact row names.

    With ``dry_run``, deletes nothing and reports what it would remove. A file a row names
    is never removed, whatever its age; deleting a file that is already gone is harmless,
    so two sweeps at once, or a sweep killed and rerun, do no damage. Never raises for one
    file it cannot read or delete (logged, left for the next sweep). With ``tenant``, only
    that tenant's folder is swept."""
    cutoff = (now or timezone.now()) - min_age
    report = OrphanReport(dry_run=dry_run)
    root = f"{ROOT}/{tenant.id}" if tenant is not None else ROOT
    for names in _batches(_files(root)):
        named = set(
            Artifact.objects.filter(storage_name__in=names).values_list("storage_name", flat=True)
        )
        for name in names:
            if name in named:
                continue
            try:
                if default_storage.get_modified_time(name) > cutoff:
                    report.kept_young += 1
                    continue
                # Read again just before deleting: the row may have come since the batch.
                if Artifact.objects.filter(storage_name=name).exists():
                    continue
                if not dry_run:
                    default_storage.delete(name)
            except Exception as exc:  # noqa: BLE001 - any backend's error: one file, not the sweep
                log.warning("orphan file skipped", extra={"file": name, "error": str(exc)})
                continue
            report.files.append(name)
    if report.files:
        log.info(
            "orphan artifact files swept",
            extra={"files": len(report.files), "dry_run": dry_run},
        )
    return report
