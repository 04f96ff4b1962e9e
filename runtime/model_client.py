"""Model clients: every model call goes through ``ModelClient.complete`` and reports its
tokens and cost, so the runtime can account for them in the run's budget.

``LocalModel`` (the default) is deterministic and needs no network: its answer is derived
from the prompt's hash, so demo runs and tests are repeatable. ``OpenAICompatibleModel``
speaks the ``/chat/completions`` protocol of OpenAI and compatible servers; select it with
``CAIRN_MODEL_CLIENT=openai``.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings

from cairn.secrets import SecretUnavailable, secret_resolve


class ModelError(Exception):
    """The model call failed; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ModelClient(Protocol):
    name: str
    provider: str  # who serves the model, as the GenAI semantic conventions name it

    def complete(self, *, prompt: str, system: str = "", max_tokens: int = 512) -> Completion: ...


def _count_tokens(text: str) -> int:
    # A stable approximation (about four characters per token); exactness is not the point,
    # repeatability is.
    return max(1, (len(text) + 3) // 4)


def _cost(tokens: int) -> float:
    return round(tokens * settings.CAIRN_MODEL_COST_PER_1K_TOKENS / 1000, 6)


_WORDS = (
    "evidence suggests sources agree the claim holds under stated conditions while "
    "measurements vary across studies and further review remains prudent before publication"
).split()


class LocalModel:
    """Deterministic stand-in for a language model: same prompt, same answer, same tokens."""

    name = "local-deterministic-1"
    provider = "cairn.local"  # gen_ai.provider.name of its spans

    def complete(self, *, prompt: str, system: str = "", max_tokens: int = 512) -> Completion:
        digest = hashlib.sha256(f"{system}\x00{prompt}".encode()).digest()
        length = min(max_tokens, 12 + digest[0] % 24)
        words = [_WORDS[digest[i % len(digest)] % len(_WORDS)] for i in range(length)]
        text = " ".join(words).capitalize() + "."
        prompt_tokens = _count_tokens(system) + _count_tokens(prompt)
        completion_tokens = _count_tokens(text)
        return Completion(
            text=text,
            model=self.name,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=_cost(prompt_tokens + completion_tokens),
        )


class OpenAICompatibleModel:
    """``POST {base_url}/chat/completions`` with a bearer key read from a secret reference."""

    provider = "openai"  # the protocol it speaks: gen_ai.provider.name of its spans

    def __init__(
        self, *, base_url: str, model: str, api_key_ref: str = "", timeout: float = 60
    ) -> None:
        if not base_url:
            raise ModelError("CAIRN_MODEL_BASE_URL is not set.", retryable=False)
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.api_key_ref = api_key_ref
        self.timeout = timeout

    def complete(self, *, prompt: str, system: str = "", max_tokens: int = 512) -> Completion:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        body = json.dumps(
            {"model": self.name, "messages": messages, "max_tokens": max_tokens}
        ).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key_ref:
            try:
                headers["Authorization"] = f"Bearer {secret_resolve(self.api_key_ref)}"
            except SecretUnavailable as exc:
                raise ModelError(str(exc), retryable=False)
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions", data=body, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            # 429 and 5xx are the provider's transient trouble; other 4xx are ours.
            retryable = exc.code == 429 or exc.code >= 500
            raise ModelError(f"The model server answered HTTP {exc.code}.", retryable=retryable)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ModelError(f"The model server is unreachable: {exc}.", retryable=True)
        except ValueError:
            raise ModelError("The model server answered with invalid JSON.", retryable=True)
        try:
            text = payload["choices"][0]["message"]["content"] or ""
            usage = payload.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens", _count_tokens(system + prompt)))
            completion_tokens = int(usage.get("completion_tokens", _count_tokens(text)))
        except (KeyError, IndexError, TypeError, ValueError):
            raise ModelError("The model server's answer has no choices[0].message.", retryable=True)
        return Completion(
            text=text,
            model=str(payload.get("model") or self.name),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=_cost(prompt_tokens + completion_tokens),
        )


def model_client_default() -> ModelClient:
    """The client the settings select: ``local`` (default) or ``openai``."""
    kind = settings.CAIRN_MODEL_CLIENT
    if kind == "openai":
        return OpenAICompatibleModel(
            base_url=settings.CAIRN_MODEL_BASE_URL,
            model=settings.CAIRN_MODEL_NAME,
            api_key_ref=settings.CAIRN_MODEL_API_KEY_REF,
            timeout=settings.CAIRN_MODEL_TIMEOUT_SECONDS,
        )
    if kind == "local":
        return LocalModel()
    raise ModelError(
        f"CAIRN_MODEL_CLIENT must be 'local' or 'openai', not '{kind}'.", retryable=False
    )
