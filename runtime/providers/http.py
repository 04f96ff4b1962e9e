"""A provider adapter for an HTTP API that honours idempotency keys (stdlib only).

perform: ``POST {base_url}{perform_path}`` with the key in the ``Idempotency-Key`` header
and ``{"action", "target", "client_reference", "payload"}`` as the JSON body.
lookup:  ``GET {base_url}{lookup_path}`` with ``{key}`` filled in, or by client reference.

Every answer maps to an Outcome; nothing here raises for what the provider says or for the
network. The only question answered "nothing was sent" is a refused connection: anything
after the connection opened may have reached the provider, so it is UNKNOWN.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from cairn.outbound import DestinationRefused, MaybeSent, NotSent, outbound_send
from cairn.secrets import SecretUnavailable, secret_resolve
from runtime.providers.base import EffectRequest, Outcome, ProviderResult

MAX_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]


class _NotSent(Exception):
    pass


class _MaybeSent(Exception):
    pass


@dataclass(frozen=True)
class HttpProvider:
    name: str
    base_url: str
    perform_path: str = "/publications"
    # None: the provider cannot look operations up, so an ambiguity goes to a person.
    lookup_path: str | None = "/publications/by-key/{key}"
    lookup_reference_path: str | None = "/publications?client_reference={reference}"
    timeout_seconds: float = 5.0
    # Long-running tools: submit a job, then poll it by its id (None: no job API).
    job_submit_path: str | None = "/jobs"
    job_status_path: str | None = "/jobs/{job_id}"
    # A secret reference (env:NAME or file:NAME), resolved at each call, never stored.
    auth_ref: str = ""
    auth_scheme: str = "Bearer"
    extra_headers: dict[str, str] = field(default_factory=dict)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", **self.extra_headers}
        if self.auth_ref:
            headers["Authorization"] = f"{self.auth_scheme} {secret_resolve(self.auth_ref)}"
        return headers

    def _call(self, method: str, path: str, *, body: Any = None, headers: dict | None = None):  # noqa: ANN202
        """One request through Cairn's outbound path (``cairn.outbound``): the destination
        is checked, connected to at the checked address, and redirects are not followed."""
        data = None if body is None else json.dumps(body).encode()
        sent_headers = {**self._headers(), **(headers or {})}
        if data is not None:
            sent_headers["Content-Type"] = "application/json"
        try:
            answer = outbound_send(
                method,
                self.base_url.rstrip("/") + path,
                body=data,
                headers=sent_headers,
                timeout=self.timeout_seconds,
                max_answer_bytes=MAX_RESPONSE_BYTES,
            )
        except DestinationRefused as error:
            raise _NotSent(str(error))
        except NotSent as error:
            raise _NotSent(f"{self.base_url} refused the connection ({error})")
        except MaybeSent as error:
            raise _MaybeSent(str(error))
        return Response(answer.status, _json(answer.body))

    def _post_effect(self, path: str, *, key: str, request: EffectRequest) -> Response:
        """POST the request under its idempotency key: a one-shot perform and a job submission
        send the same body, so the provider sees the same shape on either path."""
        body = {
            "action": request.action,
            "target": request.target,
            "client_reference": request.client_reference,
            "payload": request.payload,
        }
        return self._call("POST", path, body=body, headers={"Idempotency-Key": key})

    def perform(self, *, key: str, request: EffectRequest) -> ProviderResult:
        try:
            answer = self._post_effect(self.perform_path, key=key, request=request)
        except SecretUnavailable as exc:
            return ProviderResult(Outcome.UNAVAILABLE, reason=f"not sent: {exc}")
        except _NotSent as exc:
            return ProviderResult(Outcome.UNAVAILABLE, reason=f"not sent: {exc}")
        except _MaybeSent as exc:
            return ProviderResult(Outcome.UNKNOWN, reason=f"no answer after sending: {exc}")
        if answer.status in (200, 201) and answer.body.get("id"):
            return ProviderResult.confirmed(str(answer.body["id"]), answer.body)
        if answer.status in (408, 429) or answer.status >= 500:
            return ProviderResult(
                Outcome.UNKNOWN, reason=f"the provider answered {answer.status}: {_say(answer)}"
            )
        return ProviderResult(
            Outcome.FAILED, reason=f"the provider refused it ({answer.status}): {_say(answer)}"
        )

    def lookup(self, *, key: str, client_reference: str = "") -> ProviderResult:
        """By key first; by client reference when the key is unknown to the provider."""
        paths = []
        if self.lookup_path is not None and key:
            paths.append(self.lookup_path.format(key=urllib.parse.quote(key, safe="")))
        if self.lookup_reference_path is not None and client_reference:
            paths.append(
                self.lookup_reference_path.format(
                    reference=urllib.parse.quote(client_reference, safe="")
                )
            )
        if not paths:
            return ProviderResult(Outcome.UNKNOWN, reason=f"{self.name} cannot look operations up")
        for path in paths:
            found = self._lookup(path)
            if found.outcome != Outcome.NOT_FOUND:
                return found
        return found

    def _lookup(self, path: str) -> ProviderResult:
        try:
            answer = self._call("GET", path)
        except (SecretUnavailable, _NotSent, _MaybeSent) as exc:
            return ProviderResult(Outcome.UNAVAILABLE, reason=f"could not ask: {exc}")
        if answer.status == 200 and answer.body.get("id"):
            if answer.body.get("status") == "failed":
                return ProviderResult(
                    Outcome.FAILED, reason=f"the provider recorded it as failed: {_say(answer)}"
                )
            return ProviderResult.confirmed(str(answer.body["id"]), answer.body)
        if answer.status == 404:
            return ProviderResult(Outcome.NOT_FOUND, reason=f"{self.name} has no record of it")
        if answer.status >= 500 and answer.status not in (501,):
            return ProviderResult(
                Outcome.UNAVAILABLE, reason=f"could not ask: {answer.status} {_say(answer)}"
            )
        return ProviderResult(
            Outcome.UNKNOWN,
            reason=f"{self.name} cannot tell ({answer.status}: {_say(answer)})",
        )

    def submit(self, *, key: str, request: EffectRequest) -> ProviderResult:
        """Start a job under ``key`` (the provider answers the same job for the same key)."""
        if self.job_submit_path is None:
            return ProviderResult(Outcome.FAILED, reason=f"{self.name} has no job API")
        try:
            answer = self._post_effect(self.job_submit_path, key=key, request=request)
        except (SecretUnavailable, _NotSent) as exc:
            return ProviderResult(Outcome.UNAVAILABLE, reason=f"not sent: {exc}")
        except _MaybeSent as exc:
            return ProviderResult(Outcome.UNKNOWN, reason=f"no answer after sending: {exc}")
        if answer.status in (200, 201, 202) and answer.body.get("job_id"):
            return _job_result(answer)
        if answer.status in (408, 429) or answer.status >= 500:
            return ProviderResult(
                Outcome.UNKNOWN, reason=f"the provider answered {answer.status}: {_say(answer)}"
            )
        return ProviderResult(
            Outcome.FAILED, reason=f"the provider refused it ({answer.status}): {_say(answer)}"
        )

    def job_status(self, *, job_id: str) -> ProviderResult:
        if self.job_status_path is None:
            return ProviderResult(Outcome.UNKNOWN, reason=f"{self.name} cannot observe jobs")
        path = self.job_status_path.format(job_id=urllib.parse.quote(job_id, safe=""))
        try:
            answer = self._call("GET", path)
        except (SecretUnavailable, _NotSent, _MaybeSent) as exc:
            return ProviderResult(
                Outcome.UNAVAILABLE, reason=f"could not ask: {exc}", job_id=job_id
            )
        if answer.status == 200 and answer.body.get("job_id"):
            return _job_result(answer)
        if answer.status == 404:
            return ProviderResult(
                Outcome.NOT_FOUND, reason=f"{self.name} has no job {job_id}", job_id=job_id
            )
        if answer.status >= 500 and answer.status != 501:
            return ProviderResult(
                Outcome.UNAVAILABLE,
                reason=f"could not ask: {answer.status} {_say(answer)}",
                job_id=job_id,
            )
        return ProviderResult(
            Outcome.UNKNOWN,
            reason=f"{self.name} cannot tell ({answer.status}: {_say(answer)})",
            job_id=job_id,
        )


def _job_result(answer: Response) -> ProviderResult:
    """A job's state as the provider reports it: running, succeeded (with the result's
    ``id``) or failed."""
    body = answer.body
    job_id = str(body["job_id"])
    status = body.get("status")
    result = body.get("result") if isinstance(body.get("result"), dict) else {}
    if status == "succeeded" and result.get("id"):
        return ProviderResult(
            Outcome.CONFIRMED, provider_operation_id=str(result["id"]), result=result, job_id=job_id
        )
    if status == "failed":
        return ProviderResult(
            Outcome.FAILED, reason=f"the job failed: {_say(answer)}", job_id=job_id
        )
    return ProviderResult(Outcome.RUNNING, reason=f"job {job_id} is {status}", job_id=job_id)


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"text": raw[:300].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


def _say(answer: Response) -> str:
    return str(answer.body.get("detail") or answer.body.get("error") or answer.body)[:300]
