"""Model providers behind one interface (``base.Provider``), as a lazy registry.

Importing this package loads no adapter: an adapter (and httpx, asyncio with it) is
imported only when ``create_provider`` builds a provider of its kind, so the core can
use ``gateway.core.model`` without paying for every vendor.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.providers.base import Provider
    from gateway.providers.http import HttpProvider

__all__ = ["PROVIDERS", "ModelSettings", "create_provider"]


class _HttpAdapter(NamedTuple):
    target: str
    """``module:class`` of the adapter, imported when first built."""
    base_url: str
    api_key_env: str


_HTTP_ADAPTERS = {
    "openai": _HttpAdapter(
        "gateway.providers.openai:OpenAIProvider", "https://api.openai.com/v1", "OPENAI_API_KEY"
    ),
    "anthropic": _HttpAdapter(
        "gateway.providers.anthropic:AnthropicProvider",
        "https://api.anthropic.com",
        "ANTHROPIC_API_KEY",
    ),
    "gemini": _HttpAdapter(
        "gateway.providers.gemini:GeminiProvider",
        "https://generativelanguage.googleapis.com",
        "GEMINI_API_KEY",
    ),
}
_REALTIME_URLS = {
    "openai-realtime": ("wss://api.openai.com/v1", "OPENAI_API_KEY"),
    "gemini-live": (
        "wss://generativelanguage.googleapis.com/ws/"
        "google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent",
        "GEMINI_API_KEY",
    ),
}
"""Speech-to-speech models (``gateway.providers.realtime``): their URL and key variable."""
PROVIDERS = ("scripted", *_HTTP_ADAPTERS, *_REALTIME_URLS)


def _load(target: str) -> Any:
    """The object ``module:name`` names, importing its module now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[model]`` table of an agent file."""

    provider: str = "scripted"
    model: str | None = None
    """HTTP providers: the model name, e.g. ``gpt-4o-mini``."""
    base_url: str | None = None
    """HTTP providers: the API's base URL (a local vLLM, Ollama...); the vendor's by default."""
    api_key_env: str | None = None
    """HTTP providers: the environment variable holding the API key (never the key itself)."""
    temperature: float | None = None
    max_tokens: int | None = None
    connect_timeout: float = 10.0
    first_byte_timeout: float | None = 15.0
    """HTTP providers: seconds from sending a request to the first byte of the answer
    (None: no limit)."""
    stall_timeout: float | None = 60.0
    """HTTP providers: seconds without a byte once the answer flows before the stream counts
    as stalled (None: no limit)."""
    max_retries: int = 2
    """HTTP providers: retries of a step while nothing of it has reached the client."""
    max_retry_after: float = 30.0
    """HTTP providers: the longest ``Retry-After`` waited for; longer fails the step at once."""
    max_connections: int = 1000
    """HTTP providers: connections open to the model server at once (one per streaming
    step); a step over it waits up to ``connect_timeout`` for one."""
    tools: bool = True
    """Whether the model can call tools; an agent with tools and ``tools = false`` is refused."""
    scenario: str | None = None
    """Scripted model: path of the scenario TOML, relative to the agent file."""
    pace: float | None = None
    """Scripted model: seconds between words, overriding the scenario's."""
    voices: list[str] | None = None
    """Speech-to-speech models: the voices to offer, the default first (the vendor's list
    when unset)."""
    max_session_s: float | None = None
    """Speech-to-speech models: move the conversation to a new upstream session after this
    long. Unset: 3300 s for ``openai-realtime`` (OpenAI ends its sessions at 60 minutes),
    none for ``gemini-live`` (its ``goAway`` says when)."""


def create_provider(
    settings: ModelSettings, *, base_dir: Path, pace: float | None = None
) -> Provider:
    """Build the provider an agent asks for.

    Raises:
        ConfigError: unknown provider or bad provider settings.
    """
    if settings.provider == "scripted":
        if settings.scenario is None:
            raise ConfigError("model: the scripted provider needs 'scenario' (a TOML file)")
        # Imported here, as every adapter: importing this package must load none of them.
        from gateway.providers.scripted import ScriptedProvider, load_scenario

        scenario = load_scenario(base_dir / settings.scenario)
        return ScriptedProvider(scenario, pace=pace if pace is not None else settings.pace)
    if settings.provider in _REALTIME_URLS:
        return _realtime_provider(settings)
    adapter = _HTTP_ADAPTERS.get(settings.provider)
    if adapter is None:
        raise ConfigError(
            f"model: unknown provider {settings.provider!r}; available: {', '.join(PROVIDERS)}"
        )
    if not settings.model:
        raise ConfigError(f"model: the {settings.provider} provider needs 'model'")
    import structlog

    from gateway.providers.failure import display_url
    from gateway.providers.http import HttpModel, api_key_from_env

    key_env = settings.api_key_env or adapter.api_key_env
    http = HttpModel(
        model=settings.model,
        base_url=settings.base_url or adapter.base_url,
        api_key=api_key_from_env(settings.api_key_env, adapter.api_key_env),
        connect_timeout=settings.connect_timeout,
        first_byte_timeout=settings.first_byte_timeout,
        stall_timeout=settings.stall_timeout,
        max_retries=settings.max_retries,
        max_retry_after=settings.max_retry_after,
        max_connections=settings.max_connections,
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
    )
    if http.api_key is None:
        # Not an error: a local server (Ollama, vLLM...) needs no key.
        structlog.get_logger("gateway.providers").warning(
            "model_api_key_missing",
            provider=settings.provider,
            variable=key_env,
            base_url=display_url(http.base_url),
            hint="requests go without credentials; fine for a local server",
        )
    adapter_class: type[HttpProvider] = _load(adapter.target)
    return adapter_class(http, tools=settings.tools)


def _realtime_provider(settings: ModelSettings) -> Provider:
    """A speech-to-speech model: its upstream sessions open per conversation."""
    if not settings.model:
        raise ConfigError(f"model: the {settings.provider} provider needs 'model'")
    from gateway.providers.http import api_key_from_env
    from gateway.providers.realtime import (
        GEMINI_VOICES,
        OPENAI_SESSION_S,
        OPENAI_VOICES,
        RealtimeProvider,
    )
    from gateway.providers.realtime.upstream import Upstream

    default_url, key_env = _REALTIME_URLS[settings.provider]
    url = settings.base_url or default_url
    key = api_key_from_env(settings.api_key_env, key_env)
    model, timeout = settings.model, settings.connect_timeout

    if settings.provider == "openai-realtime":
        from gateway.providers.realtime.openai import OpenAIRealtimeUpstream

        def openai() -> Upstream:
            return OpenAIRealtimeUpstream(
                base_url=url, model=model, api_key=key, connect_timeout=timeout
            )

        return RealtimeProvider(
            settings.provider,
            openai,
            voices=tuple(settings.voices or OPENAI_VOICES),
            max_session_s=settings.max_session_s or OPENAI_SESSION_S,
        )
    from gateway.providers.realtime.gemini import GeminiLiveUpstream

    def gemini() -> Upstream:
        return GeminiLiveUpstream(url=url, model=model, api_key=key, connect_timeout=timeout)

    return RealtimeProvider(
        settings.provider,
        gemini,
        voices=tuple(settings.voices or GEMINI_VOICES),
        max_session_s=settings.max_session_s,
    )
