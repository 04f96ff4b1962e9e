"""Verify a Cairn evidence bundle offline: nothing but Python and ``cryptography``.

    python -m approvals.evidence_verify bundle.json --public-key evidence-key.pem

The module imports nothing of Cairn: copy this one file anywhere and run it as
``python -m evidence_verify …`` (docs/security.md, "Signed evidence"). It exits 0 when the
bundle verifies, 1 when it does not (each problem on its own line), 2 when it cannot be read.

A bundle (``GET /api/v1/runs/{id}/evidence``) is the canonical JSON of
``{"payload": {…}, "signature": {"algorithm": "Ed25519", "value": <hex>}}``: keys sorted, no
whitespace, ASCII only (``canonical``). The signature is over ``canonical(payload)``. The file
must be exactly its own canonical form, so changing any one byte of it either breaks the JSON,
breaks the form, or changes what was signed.

What is checked, in order:

1. the form and the Ed25519 signature under the given public key (whose id the payload names);
2. the checkpoint chain: each checkpoint's ``parent_sha256`` is its predecessor's ``sha256``,
   across gaps only through the compaction records' removed checkpoints, and the last is the
   run's head;
3. each approval that was granted or used has at least ``required_approvals`` approvals by
   distinct reviewers, each of its bound ``artifact_sha256``, none after its expiry, and no
   rejection;
4. each checkpoint that entered a state past an approval state left that approval state under
   a used approval of the state's action, bound to the checkpoint it left, for an artifact
   that checkpoint names;
   An approval bound to a reviewer's edit (``edited_from``: approve with edits) is an edit of
   an artifact the run's approvals reviewed (or its bound checkpoint names) into another one,
   and, where the bundle holds both artifacts' bytes, its ``diff`` is theirs;
5. each effect performed (an operation ``pending``, ``confirmed`` or ``unknown``) at a state
   past an approval state is covered: the approval its run passed under allows the effect's
   action, was decided before the effect, and approved the artifact that shipped (the one the
   effect's checkpoint names under the approved artifact's name, and no other under it).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import difflib
import hashlib
import json
import sys
from typing import Any

FORMAT = "cairn-evidence/1"
ALGORITHM = "Ed25519"
# Effects that were (or may have been) sent to their provider; failed and reserved were not.
PERFORMED = ("pending", "confirmed", "unknown")


class BundleError(Exception):
    """The bundle cannot be verified at all (unreadable, malformed, wrong signature)."""


def canonical(value: Any) -> bytes:
    """The one byte form of a JSON value that is signed and shipped."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def public_key_id(raw: bytes) -> str:
    """The id of an Ed25519 public key: the first 16 hex digits of its raw bytes' sha256."""
    return hashlib.sha256(raw).hexdigest()[:16]


def load_public_key(text: str):  # noqa: ANN201 (cryptography's key type)
    """A public key from a PEM block, the JSON ``GET /api/v1/evidence/public-key`` answers,
    or the raw key as hex or base64."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = text.strip()
    if text.startswith("{"):
        text = str(json.loads(text).get("public_key_pem", "")).strip()
    if text.startswith("-----BEGIN"):
        key = load_pem_public_key(text.encode())
        if not isinstance(key, Ed25519PublicKey):
            raise BundleError("The public key is not an Ed25519 key.")
        return key
    try:
        raw = bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        raise BundleError("The public key is neither PEM, hex nor base64.") from None
    if len(raw) != 32:
        raise BundleError("An Ed25519 public key is 32 bytes.")
    return Ed25519PublicKey.from_public_bytes(raw)


def _raw(key) -> bytes:  # noqa: ANN001
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def open_bundle(data: bytes, key) -> dict[str, Any]:  # noqa: ANN001
    """The signed payload of ``data`` when it is a well-formed bundle signed by ``key``;
    else BundleError saying why."""
    from cryptography.exceptions import InvalidSignature

    try:
        document = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"The bundle is not ASCII JSON: {exc}.") from None
    if not isinstance(document, dict) or set(document) != {"payload", "signature"}:
        raise BundleError("A bundle is an object of exactly 'payload' and 'signature'.")
    if canonical(document) != data:
        raise BundleError("The bundle is not in its canonical form: it was changed.")
    payload, signature = document["payload"], document["signature"]
    if not isinstance(signature, dict) or set(signature) != {"algorithm", "value"}:
        raise BundleError("The signature is an object of exactly 'algorithm' and 'value'.")
    if signature["algorithm"] != ALGORITHM:
        raise BundleError(f"The signature's algorithm is not {ALGORITHM}.")
    value = signature["value"]
    if not isinstance(value, str) or len(value) != 128 or value != value.lower():
        raise BundleError("The signature value is not 128 lowercase hex digits.")
    try:
        raw_signature = bytes.fromhex(value)
    except ValueError:
        raise BundleError("The signature value is not hex.") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise BundleError(f"The payload is not a {FORMAT} payload.")
    if payload.get("key_id") != public_key_id(_raw(key)):
        raise BundleError(
            f"The bundle was signed with key {payload.get('key_id')!r}; the public key given "
            f"is {public_key_id(_raw(key))}."
        )
    try:
        key.verify(raw_signature, canonical(payload))
    except InvalidSignature:
        raise BundleError("The signature does not verify: the bundle was changed.") from None
    return payload


# --- the content -----------------------------------------------------------------------------
def chain_problems(payload: dict[str, Any]) -> list[str]:
    """The hash chain, from the first checkpoint to the run's head, with gaps only where
    retention removed checkpoints and recorded their hashes."""
    problems: list[str] = []
    links = {c["sequence"]: c for c in payload["checkpoints"]}
    for record in payload.get("compactions", []):
        for removed in record["removed"]:
            links.setdefault(removed["sequence"], removed)
    run = payload["run"]
    head = run["checkpoint_sequence"]
    previous_sha = ""
    for sequence in range(1, head + 1):
        link = links.get(sequence)
        if link is None:
            problems.append(f"checkpoint {sequence} is missing and no compaction records it")
            previous_sha = None
            continue
        if previous_sha is not None and link["parent_sha256"] != previous_sha:
            problems.append(
                f"checkpoint {sequence} names parent {link['parent_sha256'][:12] or '(none)'}, "
                f"not checkpoint {sequence - 1}'s sha256 {previous_sha[:12] or '(none)'}"
            )
        previous_sha = link["sha256"]
    if head and links.get(head, {}).get("sha256") != run["latest_checkpoint_sha256"]:
        problems.append(f"the run's head is not checkpoint {head} of the chain")
    if any(s > head for s in links):
        problems.append(f"the bundle holds checkpoints past the run's head {head}")
    return problems


def edit_diff(old: bytes, new: bytes, *, old_sha256: str, new_sha256: str) -> str:
    """The unified diff of a reviewer's edit of ``old`` into ``new`` (UTF-8 text), labelled
    with the two hashes: what the bundle holds as an edit's ``diff``."""
    lines = difflib.unified_diff(
        old.decode("utf-8", errors="replace").splitlines(keepends=True),
        new.decode("utf-8", errors="replace").splitlines(keepends=True),
        fromfile=f"shown {old_sha256}",
        tofile=f"edited {new_sha256}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def edit_problems(payload: dict[str, Any]) -> list[str]:
    """Each approval bound to a reviewer's edit names an edit of an artifact the run's
    approvals reviewed, or its bound checkpoint names, into another; its diff is the two
    artifacts' where the bundle holds their bytes."""
    problems: list[str] = []
    reviewed = {a["artifact_sha256"] for a in payload["approvals"]}
    links = {c["sequence"]: c for c in payload["checkpoints"]}
    content = {
        a["sha256"]: a["content_base64"] for a in payload["artifacts"] if "content_base64" in a
    }
    for approval in payload["approvals"]:
        edit = approval.get("edited_from")
        if edit is None:
            continue
        name = f"approval {approval['id']}"
        origin, edited = edit["artifact_sha256"], approval["artifact_sha256"]
        bound = links.get(approval["checkpoint_sequence"], {}).get("artifacts", {})
        if origin == edited:
            problems.append(f"{name} is an edit that changed nothing")
        if origin not in bound and origin not in reviewed - {edited}:
            problems.append(f"{name} is an edit of {origin[:12]}, which nothing reviewed")
        if origin in content and edited in content:
            old, new = base64.b64decode(content[origin]), base64.b64decode(content[edited])
            if hashlib.sha256(old).hexdigest() != origin or (
                hashlib.sha256(new).hexdigest() != edited
            ):
                problems.append(f"{name}: the bytes of its artifacts do not hash to them")
            elif edit_diff(old, new, old_sha256=origin, new_sha256=edited) != edit["diff"]:
                problems.append(f"{name}: its diff is not the diff of its two artifacts")
    return problems


def approval_problems(payload: dict[str, Any]) -> list[str]:
    """Each granted or used approval has its quorum of distinct reviewers, each deciding on
    the bound hash before the expiry, and no rejection."""
    problems: list[str] = []
    for approval in payload["approvals"]:
        if approval["status"] not in ("approved", "consumed"):
            continue
        name = f"approval {approval['id']}"
        decisions = approval["decisions"]
        reviewers = {d["reviewer"] for d in decisions if d["decision"] == "approve"}
        if any(d["decision"] == "reject" for d in decisions):
            problems.append(f"{name} is {approval['status']} but holds a rejection")
        if len(reviewers) < approval["required_approvals"]:
            problems.append(
                f"{name} needs {approval['required_approvals']} approvals by distinct "
                f"reviewers and has {len(reviewers)}"
            )
        for decision in decisions:
            if decision["artifact_sha256"] != approval["artifact_sha256"]:
                problems.append(
                    f"{name}: {decision['reviewer']} decided on {decision['artifact_sha256'][:12]}"
                    f", not the bound {approval['artifact_sha256'][:12]}"
                )
            if decision["decided_at"] > approval["expires_at"]:
                problems.append(f"{name}: {decision['reviewer']} decided after its expiry")
    return problems


def _entry_approval(
    payload: dict[str, Any], link: dict[str, Any], gate: dict[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """The used approval that let ``link`` enter the stretch past ``gate``, or why none."""
    links = {c["sequence"]: c for c in payload["checkpoints"]}
    before = links.get(link["sequence"] - 1)
    if before is not None and before["state"] != gate["state"]:
        return None, f"from '{before['state']}', not from the approval state '{gate['state']}'"
    for approval in payload["approvals"]:
        if approval["status"] != "consumed" or approval["action"] != gate["action"]:
            continue
        bound = (approval["checkpoint_sequence"], approval["checkpoint_sha256"])
        if bound == (link["sequence"] - 1, link["parent_sha256"]):
            if approval["artifact_sha256"] in link["artifacts"]:
                return approval, ""
        elif before is None and approval["checkpoint_sequence"] < link["sequence"]:
            return approval, ""  # across a compacted gap: one bound inside it
    return None, f"without a used approval of '{gate['action']}' bound to the checkpoint it left"


Entries = dict[tuple[str, int], dict[str, Any]]


def passage_problems(payload: dict[str, Any]) -> tuple[list[str], Entries]:
    """Every entry into a stretch past an approval state, and the approval it passed under
    (keyed by the approval state and the entering checkpoint's sequence)."""
    problems: list[str] = []
    entries: Entries = {}
    terminal = set(payload["workflow"]["terminal"])
    ordered = sorted(payload["checkpoints"], key=lambda c: c["sequence"])
    last = ordered[-1]["sequence"] if ordered else 0
    succeeded = payload["run"]["status"] == "succeeded"
    for gate in payload["workflow"]["approval_states"]:
        past = set(gate["past"])
        inside = False
        for link in ordered:
            if link["state"] not in past:
                inside = False
                continue
            if inside:
                continue
            approval, why = _entry_approval(payload, link, gate)
            if approval is None:
                if link["state"] in terminal and not (link["sequence"] == last and succeeded):
                    continue  # the run ended there without going on (a rejection)
                problems.append(
                    f"checkpoint {link['sequence']} enters '{link['state']}', past the approval "
                    f"state '{gate['state']}', {why}"
                )
            else:
                entries[(gate["state"], link["sequence"])] = approval
            inside = link["state"] not in terminal
    return problems, entries


def effect_problems(payload: dict[str, Any], entries: Entries) -> list[str]:
    """Each effect performed past an approval state is covered by the approval the run
    passed the nearest one under (the one it entered last), of the artifact that shipped."""
    problems: list[str] = []
    links = {c["sequence"]: c for c in payload["checkpoints"]}
    for op in payload["operations"]:
        if op["status"] not in PERFORMED:
            continue
        name = f"effect {op['idempotency_key']} ({op['action']})"
        link = links.get(op["checkpoint_sequence"])
        if link is None:
            problems.append(f"{name} names checkpoint {op['checkpoint_sequence']}, not a link")
            continue
        around = []
        for gate in payload["workflow"]["approval_states"]:
            if link["state"] not in gate["past"]:
                continue
            sequence = link["sequence"]
            while sequence - 1 in links and links[sequence - 1]["state"] in gate["past"]:
                sequence -= 1
            around.append((sequence, gate))
        if not around:
            continue
        sequence, gate = max(around, key=lambda pair: pair[0])
        approval = entries.get((gate["state"], sequence))
        if approval is None:
            problems.append(
                f"{name} was performed past '{gate['state']}' without an approval the run "
                "passed it under"
            )
            continue
        approved = approval["artifact_sha256"]
        named = links[sequence]["artifacts"].get(approved)
        shipped = link["artifacts"]
        swapped = sorted(s for s, n in shipped.items() if n == named and s != approved)
        if approval["action"] != op["action"]:
            problems.append(f"{name} is not the approved action '{approval['action']}'")
        if approved not in shipped or swapped:
            problems.append(
                f"{name} shipped {(swapped or ['another artifact'])[0][:12]}, not the "
                f"approved artifact {approved[:12]}"
            )
        if (approval["decided_at"] or "~") > op["created_at"]:
            problems.append(f"{name} was performed before its approval was decided")
    return problems


def verify(data: bytes, key) -> list[str]:  # noqa: ANN001
    """Every problem of the bundle ``data`` under ``key``; empty when it verifies."""
    try:
        payload = open_bundle(data, key)
        passage, entries = passage_problems(payload)
        return [
            *chain_problems(payload),
            *approval_problems(payload),
            *edit_problems(payload),
            *passage,
            *effect_problems(payload, entries),
            *(f"Cairn reported: {p}" for p in payload["server_check"]["problems"]),
        ]
    except BundleError as exc:
        return [str(exc)]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return [f"The payload is malformed: {type(exc).__name__} {exc}."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m approvals.evidence_verify",
        description="Verify a Cairn evidence bundle offline.",
    )
    parser.add_argument("bundle", help="the bundle file (GET /api/v1/runs/{id}/evidence)")
    parser.add_argument(
        "--public-key",
        required=True,
        help="the deployment's public key: a PEM file, or the JSON of "
        "GET /api/v1/evidence/public-key",
    )
    args = parser.parse_args(argv)
    try:
        with open(args.bundle, "rb") as handle:
            data = handle.read()
        with open(args.public_key, encoding="utf-8") as handle:
            key = load_public_key(handle.read())
    except (OSError, ValueError, BundleError) as exc:
        print(f"cannot verify: {exc}", file=sys.stderr)
        return 2
    problems = verify(data, key)
    if problems:
        print(f"NOT VERIFIED: {args.bundle}")
        for problem in problems:
            print(f"- {problem}")
        return 1
    payload = json.loads(data)["payload"]
    run = payload["run"]
    print(
        f"VERIFIED: run {run['id']} ({run['workflow_type']}), {len(payload['checkpoints'])} "
        f"checkpoints, {len(payload['approvals'])} approvals, {len(payload['operations'])} "
        f"operations, signed by key {payload['key_id']} at {payload['exported_at']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
