"""Model providers behind one interface (``base.Provider``)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gateway.errors import ConfigError
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import Provider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.http import HttpModel, HttpProvider, api_key_from_env
from gateway.providers.openai import OpenAIProvider
from gateway.providers.scripted import ScriptedProvider, load_scenario

__all__ = ["PROVIDERS", "ModelSettings", "create_provider"]

# provider -> (default base URL, default API key variable)
_HTTP_PROVIDERS = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "anthropic": ("https://api.anthropic.com", "ANTHROPIC_API_KEY"),
    "gemini": ("https://generativelanguage.googleapis.com", "GEMINI_API_KEY"),
}
PROVIDERS = ("scripted", *_HTTP_PROVIDERS)


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
    stall_timeout: float = 60.0
    """Seconds without a byte from the model before the stream counts as stalled."""
    max_retries: int = 2
    tools: bool = True
    """Whether the model can call tools; an agent with tools and ``tools = false`` is refused."""
    scenario: str | None = None
    """Scripted model: path of the scenario TOML, relative to the agent file."""
    pace: float | None = None
    """Scripted model: seconds between words, overriding the scenario's."""


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
        scenario = load_scenario(base_dir / settings.scenario)
        return ScriptedProvider(scenario, pace=pace if pace is not None else settings.pace)
    if settings.provider not in _HTTP_PROVIDERS:
        raise ConfigError(
            f"model: unknown provider {settings.provider!r}; available: {', '.join(PROVIDERS)}"
        )
    if not settings.model:
        raise ConfigError(f"model: the {settings.provider} provider needs 'model'")
    default_url, default_key = _HTTP_PROVIDERS[settings.provider]
    http = HttpModel(
        model=settings.model,
        base_url=settings.base_url or default_url,
        api_key=api_key_from_env(settings.api_key_env, default_key),
        connect_timeout=settings.connect_timeout,
        stall_timeout=settings.stall_timeout,
        max_retries=settings.max_retries,
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
    )
    adapters: dict[str, type[HttpProvider]] = {
        "openai": OpenAIProvider,
        "anthropic": AnthropicProvider,
        "gemini": GeminiProvider,
    }
    return adapters[settings.provider](http, tools=settings.tools)
