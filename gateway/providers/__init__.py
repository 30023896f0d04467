"""Model providers behind one interface (``base.Provider``)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gateway.errors import ConfigError
from gateway.providers.base import Provider
from gateway.providers.scripted import ScriptedProvider, load_scenario

__all__ = ["PROVIDERS", "ModelSettings", "create_provider"]

PROVIDERS = ("scripted",)


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[model]`` table of an agent file."""

    provider: str = "scripted"
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
    raise ConfigError(
        f"model: unknown provider {settings.provider!r}; available: {', '.join(PROVIDERS)}"
    )
