"""The browser SDK as ES modules with no build step: each module is served, preloaded by the
demo page, imports only modules that exist, and none imports another in a cycle."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.support import serving

ROOT = Path(__file__).parents[1]
SDK = ROOT / "client_sdk" / "js"
MODULES = sorted(p.name for p in SDK.glob("*.js") if not p.name.endswith(".test.js"))
_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;]*?\bfrom\s+["'](\./[\w.-]+)["']""", re.M)


def imports(name: str) -> set[str]:
    return {target.removeprefix("./") for target in _IMPORT.findall((SDK / name).read_text())}


def test_every_sdk_module_is_preloaded_by_the_demo_page():
    page = (ROOT / "web_demo" / "index.html").read_text()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/sdk/([\w.-]+)">', page))
    assert preloaded == set(MODULES)


def test_sdk_modules_import_only_modules_that_exist_and_form_no_cycle():
    graph = {name: imports(name) for name in MODULES}
    assert "gateway-client.js" in graph
    for name, targets in graph.items():
        assert targets <= set(MODULES), f"{name} imports {targets - set(MODULES)}"
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name not in done:
            for target in sorted(graph[name]):
                visit(target, (*path, name))
            done.add(name)

    for name in MODULES:
        visit(name, ())
    reachable: set[str] = set()
    stack = ["gateway-client.js"]
    while stack:
        name = stack.pop()
        if name not in reachable:
            reachable.add(name)
            stack.extend(graph[name])
    assert reachable == set(MODULES), f"not reached from the entry: {set(MODULES) - reachable}"


async def test_every_sdk_module_is_served_as_javascript():
    async with serving() as gateway:
        base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
        async with httpx.AsyncClient(base_url=base) as http:
            for name in MODULES:
                answer = await http.get(f"/sdk/{name}")
                assert answer.status_code == 200, name
                assert "javascript" in answer.headers["content-type"], name
                assert answer.content == (SDK / name).read_bytes(), name
