"""The toolbox puts an agent's tool backends together: one name per tool, calls routed to
the backend under its own name, backends that cannot start. The backends here are fakes (a
unit test of the seam); the real ones have their own tests (test_mcp_tools.py,
test_openapi_tools.py) and meet in test_tool_backends_e2e.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.core.tool import ToolDef
from gateway.errors import ConfigError, ToolError
from gateway.tools.backend import (
    BackendKind,
    Toolbox,
    ToolOptions,
    expand_env,
    tool_name,
    with_options,
)


def server_tool(name: str) -> ToolDef:
    return ToolDef(
        name=name,
        description=f"The {name} tool.",
        kind="server",
        input_schema={"type": "object", "properties": {}},
    )


class FakeBackend:
    def __init__(
        self,
        prefix: str,
        names: Sequence[str],
        *,
        kind: BackendKind = "mcp",
        optional: bool = False,
        fails: bool = False,
    ) -> None:
        self.name = f"{kind}:{prefix}"
        self.kind = kind
        self.prefix = prefix
        self.optional = optional
        self._fails = fails
        self._started = False
        self._names = list(names)
        self._listeners: list[Callable[[], None]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.closed = False

    async def start(self) -> None:
        if self._fails:
            raise ConfigError("cannot connect: connection refused")
        self._started = True

    def definitions(self) -> list[ToolDef]:
        return (
            [server_tool(n) for n in self._names] if self._started or self.kind == "python" else []
        )

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def change(self, names: Sequence[str]) -> None:
        self._names = list(names)
        for listener in self._listeners:
            listener()

    async def call(
        self, name: str, args: dict[str, Any], progress: Callable[[Any], None], caller: Any = None
    ) -> Any:
        self.calls.append((name, args))
        progress({"step": 1})
        return {"ran": f"{self.prefix}.{name}"}

    async def aclose(self) -> None:
        self.closed = True


async def test_clashing_tools_of_remote_backends_are_prefixed_and_called_by_their_own_names():
    python = FakeBackend("python", ["lookup"], kind="python")
    files = FakeBackend("files", ["search", "read", "lookup"])
    web = FakeBackend("web", ["search"])
    box = Toolbox([python, files, web])
    await box.start()
    names = [d.name for d in box.registry.definitions()]
    # The agent author's own tool keeps its name; both remote `search`es are prefixed.
    assert names == ["lookup", "files_search", "read", "files_lookup", "web_search"]
    reports: list[Any] = []
    assert await box.call("web_search", {"q": "x"}, reports.append) == {"ran": "web.search"}
    assert web.calls == [("search", {"q": "x"})]
    assert reports == [{"step": 1}]
    assert box.backend_of("files_lookup") is files
    assert [(r.definition.name, r.backend) for r in box.rows()][-1] == ("web_search", "mcp:web")


async def test_two_python_tools_or_a_client_function_clash_are_startup_errors():
    with pytest.raises(ConfigError, match="'lookup': defined twice"):
        Toolbox([FakeBackend("a", ["lookup"], kind="python")], [server_tool("lookup")])


async def test_a_backend_that_cannot_start_fails_startup_naming_it_unless_optional():
    box = Toolbox([FakeBackend("down", ["x"], fails=True)])
    with pytest.raises(ConfigError, match="mcp:down: cannot connect"):
        await box.start()
    spare = FakeBackend("spare", ["y"], optional=True, fails=True)
    ok = FakeBackend("ok", ["z"])
    box = Toolbox([spare, ok])
    with capture_logs() as logs:
        await box.start()
    assert [d.name for d in box.registry.definitions()] == ["z"]
    assert any(e["event"] == "tool_backend_unavailable" for e in logs)


async def test_a_changed_list_is_taken_and_a_clash_it_brings_is_left_out_not_fatal():
    python = FakeBackend("python", ["lookup"], kind="python")
    files = FakeBackend("files", ["read"])
    box = Toolbox([python, files])
    await box.start()
    files.change(["read", "write"])
    assert [d.name for d in box.registry.definitions()] == ["lookup", "read", "write"]
    files.change(["write", "Bad Name!!", "write"])  # twice: prefixed, then still twice
    with capture_logs() as logs:
        files.change(["write", "write"])
    assert [d.name for d in box.registry.definitions()] == ["lookup", "files_write"]
    assert any(e["event"] == "tool_left_out" for e in logs)
    with pytest.raises(ToolError, match="no server tool 'read' is offered any more"):
        await box.call("read", {}, lambda _: None)


async def test_closing_the_toolbox_closes_every_backend():
    backends = [FakeBackend("a", ["x"]), FakeBackend("b", ["y"])]
    box = Toolbox(backends)
    await box.start()
    await box.aclose()
    assert all(b.closed for b in backends)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("getOrder", "get_order"),
        ("files.read-text", "files_read_text"),
        ("GET /orders/{order_id}", "get_orders_order_id"),
        ("2fa", "t_2fa"),
        ("x" * 80, "x" * 64),
    ],
)
def test_tool_names_from_elsewhere_become_snake_case(given: str, expected: str):
    assert tool_name(given) == expected


def test_options_replace_only_what_they_set():
    changed = with_options(server_tool("a"), ToolOptions(execution="async", timeout=30))
    assert (changed.execution, changed.timeout, changed.delivery) == ("async", 30, "when_idle")


def test_environment_variables_fill_values_and_a_missing_one_is_named():
    assert expand_env("Bearer ${TOKEN}", "x", {"TOKEN": "s3cret"}) == "Bearer s3cret"
    with pytest.raises(ConfigError, match="mcp:files: environment variable TOKEN is not set"):
        expand_env("Bearer ${TOKEN}", "mcp:files", {})
