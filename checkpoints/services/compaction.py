"""Keeping the hash chain verifiable across the checkpoints compaction removed.

Each ``CompactionRecord`` keeps the sequence, sha256 and parent sha256 of every checkpoint
it removed. ``run_verify`` asks ``CompactionIndex.bridge`` about every gap between two
kept checkpoints: the gap is fine only when records cover every missing sequence and their
hashes link the kept checkpoint before the gap, through each removed one, to the parent
hash the kept checkpoint after the gap names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from checkpoints.models import CompactionRecord, Run


@dataclass
class CompactionIndex:
    entries: dict[int, tuple[dict[str, Any], CompactionRecord]] = field(default_factory=dict)

    def bridge(
        self, *, after: tuple[int, str | None], sequence: int, parent_sha256: str, where: str
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """(problems, compacted ranges) for the gap between ``after`` (sequence, sha256 of
        the kept checkpoint before it; sha256 None at the head of the history) and the kept
        checkpoint ``sequence`` whose parent hash is ``parent_sha256``."""
        first, last = after[0] + 1, sequence - 1
        unexplained = [s for s in range(first, last + 1) if s not in self.entries]
        if unexplained:
            span = _span(unexplained[0], unexplained[-1])
            return [f"{where}: the history has a gap ({span}) that no compaction explains"], []
        problems: list[str] = []
        expected = after[1]
        for number in range(first, last + 1):
            entry = self.entries[number][0]
            if expected is not None and entry["parent_sha256"] != expected:
                problems.append(
                    f"compacted checkpoint {number} names parent hash "
                    f"{entry['parent_sha256'][:12]}, but its predecessor hashes to {expected[:12]}"
                )
            expected = entry["sha256"]
        if parent_sha256 != expected:
            problems.append(
                f"{where} names parent hash {parent_sha256[:12]}, but compacted checkpoint "
                f"{last} hashed to {(expected or '')[:12]}"
            )
        if problems:
            return problems, []
        return [], self._ranges(first, last)

    def _ranges(self, first: int, last: int) -> list[dict[str, Any]]:
        ranges: list[dict[str, Any]] = []
        for number in range(first, last + 1):
            record = self.entries[number][1]
            if ranges and ranges[-1]["record"] == record.pk and ranges[-1]["to"] == number - 1:
                ranges[-1]["to"] = number
                ranges[-1]["count"] += 1
                continue
            ranges.append(
                {
                    "record": record.pk,
                    "from": number,
                    "to": number,
                    "count": 1,
                    "compacted_at": record.created_at.isoformat(),
                    "policy": record.policy_label,
                    "reason": record.reason,
                }
            )
        return ranges


def _span(first: int, last: int) -> str:
    return f"checkpoint {first}" if first == last else f"checkpoints {first}–{last}"


def compaction_index(run: Run) -> CompactionIndex:
    index = CompactionIndex()
    for record in CompactionRecord.objects.filter(run=run).order_by("id"):
        for entry in record.removed:
            index.entries[int(entry["sequence"])] = (entry, record)
    return index
