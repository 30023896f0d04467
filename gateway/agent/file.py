"""Agents and the crew they hand over to: an agent file loaded, checked and made ready.

The file's format is ``gateway.agent.spec``; here its references are followed (modules and
files of Python tools, confirmation rules, MCP servers, OpenAPI documents, other agents) and
put together as an ``Agent``. A bad file fails at startup with the file, the tool and the
reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from gateway.agent.spec import AgentFile
from gateway.config import load_toml
from gateway.core.confirm import ConfirmRule
from gateway.core.tool import ToolDef, ToolRegistry, default_display_name
from gateway.errors import ConfigError
from gateway.providers import ModelSettings, create_provider
from gateway.providers.base import Provider
from gateway.tools.base import ToolBackend
from gateway.tools.entry import A2AAgentEntry, McpServerEntry, OpenApiEntry, ToolOptions
from gateway.tools.python import PythonTools, ServerTool
from gateway.tools.system import SystemTools, TransferTarget
from gateway.tools.toolbox import Toolbox

__all__ = ["DEMO_AGENT", "Agent", "Webhook", "load_agent", "load_crew"]

DEMO_AGENT = Path(__file__).parents[1] / "demo" / "agent.toml"


_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Hosts a webhook may reach over plain ``http://`` (a receiver on the same machine, as in
tests and local development); any other host needs ``https://``: the notices are signed,
not encrypted."""


@dataclass(frozen=True)
class Webhook:
    """Where the agent's push notices go (``notify_url``) and the key that signs them."""

    url: str
    secret: bytes = field(repr=False)
    """The HMAC-SHA256 key, from the environment variable ``notify_secret_env`` names."""


@dataclass(frozen=True, kw_only=True)
class Agent:
    """A loaded, checked agent; ready to serve sessions once ``start`` has connected the
    tool backends it names (MCP servers, OpenAPI documents)."""

    name: str
    instructions: str
    toolbox: Toolbox
    """Its server tools, whatever runs them, and its client functions."""
    provider: Provider
    model: str | None = None
    """The model's name for HTTP providers (``gpt-4o-mini``); ``None`` for the scripted one."""
    suggestions: tuple[str, ...] = ()
    """Example prompts for chat pages, from the agent file (may be empty)."""
    confirm_rules: dict[str, ConfirmRule] = field(default_factory=dict)
    """The functions tools name in ``confirm_rule``, by that reference."""
    source: Path | None = None
    """The agent file it was loaded from (``None``: built in code)."""
    transfers: dict[str, Path] = field(default_factory=dict)
    """The agents ``transfer_to_agent`` may hand a session to: name -> agent file."""
    notify: Webhook | None = None
    """Where to POST a notice when an event wants the user while no socket is attached
    (docs/mobile.md); ``None``: no notices."""
    description: str = ""
    """What the agent does, from the agent file (its A2A card says it)."""
    a2a: bool = False
    """Served over A2A too (the file's ``a2a = true``; docs/a2a.md)."""

    @property
    def tools(self) -> ToolRegistry:
        """Every tool the agent offers now (an MCP server may change its list)."""
        return self.toolbox.registry

    async def start(self) -> None:
        """Connect the tool backends and list their tools.

        Raises:
            ConfigError: a backend that is not optional cannot start, the tools clash, or
                the model cannot call tools but the backends brought some.
        """
        await self.toolbox.start()
        try:
            _check_model_takes_tools(self.provider, self.tools)
        except ConfigError:
            await self.toolbox.aclose()
            raise

    async def aclose(self) -> None:
        """Close the tool backends (their connections and processes)."""
        await self.toolbox.aclose()


def _import_tool(ref: str, base_dir: Path) -> object:
    module_name, _, attr = ref.partition(":")
    if not attr:
        raise ConfigError(f"server tool {ref!r}: expected 'module:name' or 'file.py:name'")
    try:
        if module_name.endswith(".py"):
            path = base_dir / module_name
            spec = importlib.util.spec_from_file_location(f"_agent_tools_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"server tool {ref!r}: cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError, SyntaxError) as exc:
        raise ConfigError(f"server tool {ref!r}: cannot import: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"server tool {ref!r}: {module_name} has no {attr!r}") from exc


def load_agent(
    path: Path,
    *,
    pace: float | None = None,
    model: str | None = None,
    base_url: str | None = None,
    chain: tuple[Path, ...] = (),
) -> Agent:
    """Load and check an agent file.

    Args:
        path: the agent TOML file.
        pace: scripted model only: seconds between words, overriding the files.
        model: ``provider:model`` replacing the file's model (``gateway serve --model``).
        base_url: the model API's base URL, replacing the file's.
        chain: the agent files that name this one as a tool, outermost first.

    Raises:
        ConfigError: naming the file, the tool and the reason.
    """
    spec = load_toml(path, AgentFile)
    try:
        transfers = _transfer_targets(spec, path)
        settings = _override(spec.model, model, base_url)
        python_tools: list[ServerTool] = []
        for entry in spec.server_tools:
            found = _import_tool(entry.ref, path.parent)
            if not isinstance(found, ServerTool):
                raise ConfigError(f"server tool {entry.ref!r}: not decorated with @tool")
            options = ToolOptions(
                timeout=entry.timeout,
                delivery=entry.delivery,
                scopes=entry.scopes,
                confirm=entry.confirm,
                confirm_prompt=entry.confirm_prompt,
                confirm_rule=entry.confirm_rule,
            )
            python_tools.append(found.with_options(options))
        client_defs = [
            ToolDef(
                name=fn.name,
                description=fn.description,
                kind="client",
                input_schema=fn.input_schema,
                output_schema=fn.output_schema,
                display_name=fn.display_name or default_display_name(fn.name),
                timeout=fn.timeout,
                confirm=fn.confirm,
                confirm_prompt=fn.confirm_prompt,
                confirm_rule=fn.confirm_rule,
                widget=fn.widget,
            )
            for fn in spec.client_functions
        ]
        toolbox = Toolbox(
            [
                PythonTools(python_tools),
                *_remote_backends(
                    spec,
                    path.parent,
                    (*chain, path.resolve()),
                    [target for target, _ in transfers],
                ),
            ],
            client_defs,
            confirm_mcp_writes=spec.confirm_mcp_writes,
        )
        rules = _confirm_rules(spec, toolbox, path.parent)
        notify = _webhook(spec)
        provider = create_provider(settings, base_dir=path.parent, pace=pace)
        _check_model_takes_tools(provider, toolbox.registry)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return Agent(
        name=spec.name,
        instructions=spec.instructions.strip(),
        toolbox=toolbox,
        confirm_rules=rules,
        provider=provider,
        model=settings.model if settings.provider != "scripted" else None,
        suggestions=tuple(spec.suggestions),
        source=path.resolve(),
        transfers={target.name: file for target, file in transfers},
        notify=notify,
        description=spec.description.strip(),
        a2a=spec.a2a,
    )


def load_crew(main: Agent, *, pace: float | None = None) -> dict[str, Agent]:
    """``main`` and every agent a session of it may be handed to, directly or through
    others (each file loaded once: agents may hand back to one another), by name.

    Raises:
        ConfigError: one of their files is invalid, or two files name the same agent.
    """
    crew = {main.name: main}
    waiting = [main]
    while waiting:
        for name, file in waiting.pop().transfers.items():
            known = crew.get(name)
            if known is None:
                crew[name] = known = load_agent(file, pace=pace)
                waiting.append(known)
            if known.source != file:
                raise ConfigError(f"{file}: the agent {name!r} is {known.source} already")
    return crew


def _transfer_targets(spec: AgentFile, path: Path) -> list[tuple[TransferTarget, Path]]:
    """The agents ``[[transfers]]`` lists, each with its file (only their names are read
    here: ``load_crew`` loads them)."""
    targets: list[tuple[TransferTarget, Path]] = []
    for entry in spec.transfers:
        file = (path.parent / entry.file).resolve()
        name = load_toml(file, AgentFile).name
        if name == spec.name:
            raise ConfigError(f"transfers: {entry.file} is this agent ({name!r})")
        if any(target.name == name for target, _ in targets):
            raise ConfigError(f"transfers: {name!r} is listed twice")
        targets.append((TransferTarget(name, entry.description), file))
    return targets


def _confirm_rules(spec: AgentFile, toolbox: Toolbox, base_dir: Path) -> dict[str, ConfirmRule]:
    """The confirmation rules the file names (its tools', and its backends' options), each
    imported once, by reference."""
    refs = {d.confirm_rule for d in toolbox.registry.definitions() if d.confirm_rule}
    entries: list[McpServerEntry | OpenApiEntry | A2AAgentEntry] = [
        *spec.mcp_servers,
        *spec.openapi,
        *spec.a2a_agents,
    ]
    for entry in entries:
        refs |= {o.confirm_rule for o in entry.tool_options.values() if o.confirm_rule}
    rules: dict[str, ConfirmRule] = {}
    for ref in sorted(refs):
        found = _import_tool(ref, base_dir)
        if not callable(found):
            raise ConfigError(f"confirm_rule {ref!r}: not a function")
        rules[ref] = found
    return rules


def _remote_backends(
    spec: AgentFile,
    base_dir: Path,
    chain: tuple[Path, ...],
    transfers: list[TransferTarget],
) -> list[ToolBackend]:
    """The MCP servers, OpenAPI documents, remote A2A agents, system tools and other agents
    the file names, not started."""
    backends: list[ToolBackend] = []
    if spec.mcp_servers:
        from gateway.tools.mcp.backend import McpTools  # the MCP SDK is loaded only when used

        backends += [McpTools(entry, base_dir) for entry in spec.mcp_servers]
    if spec.openapi:
        from gateway.tools.openapi.backend import OpenApiTools

        backends += [OpenApiTools(entry, base_dir) for entry in spec.openapi]
    if spec.a2a_agents:
        from gateway.tools.a2a.backend import A2ATools  # the A2A SDK is loaded only when used

        backends += [A2ATools(entry) for entry in spec.a2a_agents]
    if spec.system_tools or transfers:
        backends.append(SystemTools(spec.system_tools, transfers=transfers))
    if spec.agent_tools:
        from gateway.tools.agent import AgentTools

        backends += [AgentTools(entry, _load_other, base_dir, chain) for entry in spec.agent_tools]
    names = [b.name for b in backends]
    if clash := {n for n in names if names.count(n) > 1}:
        raise ConfigError(f"{', '.join(sorted(clash))}: named twice")
    return backends


def _load_other(path: Path, chain: tuple[Path, ...]) -> Agent:
    """An agent another agent names as a tool (``[[agent_tools]]``)."""
    return load_agent(path, chain=chain)


def _webhook(spec: AgentFile) -> Webhook | None:
    """The file's ``notify_url`` with its secret, checked: a notice must not leave the
    machine unencrypted, nor go unsigned."""
    if spec.notify_url is None:
        if spec.notify_secret_env is not None:
            raise ConfigError("notify_secret_env: set without notify_url")
        return None
    url = urlsplit(spec.notify_url)
    if url.scheme not in ("https", "http") or not url.hostname:
        raise ConfigError(f"notify_url {spec.notify_url!r}: expected an https:// URL")
    if url.scheme == "http" and url.hostname not in _LOCAL_HOSTS:
        raise ConfigError(
            f"notify_url {spec.notify_url!r}: http:// only to localhost; use https://"
        )
    if not spec.notify_secret_env:
        raise ConfigError("notify_url: notify_secret_env must name the secret's variable")
    secret = os.environ.get(spec.notify_secret_env, "")
    if not secret:
        raise ConfigError(
            f"notify_secret_env: the environment variable {spec.notify_secret_env} "
            "is not set (or empty)"
        )
    return Webhook(spec.notify_url, secret.encode())


def _check_model_takes_tools(provider: Provider, tools: ToolRegistry) -> None:
    if len(tools) and not provider.capabilities.tools:
        names = ", ".join(d.name for d in tools.definitions())
        raise ConfigError(
            f"model: provider {provider.name!r} cannot call tools, but the agent has: {names}"
        )


def _override(settings: ModelSettings, model: str | None, base_url: str | None) -> ModelSettings:
    if model is not None:
        provider, sep, name = model.partition(":")
        if not sep or not name:
            raise ConfigError(
                f"--model {model!r}: expected provider:model, e.g. openai:gpt-4o-mini"
            )
        settings = msgspec.structs.replace(settings, provider=provider, model=name)
    if base_url is not None:
        settings = msgspec.structs.replace(settings, base_url=base_url)
    return settings
