"""Provider adapters: how Cairn performs a side effect and later asks what became of it.

This package imports nothing from Django at module level, so the local publishing service
(``python -m runtime.providers.publishing_service``) runs without settings.
"""

from runtime.providers.base import EffectRequest, Outcome, Provider, ProviderResult

__all__ = ["EffectRequest", "Outcome", "Provider", "ProviderResult"]
