"""OpenApiTools against a real HTTP API (tests/openapi_service.py): the tools it makes of an
OpenAPI document, and the requests it sends for them."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.core.tool import ToolDef, ToolRegistry
from gateway.errors import ConfigError, ToolError
from gateway.tools.backend import OpenApiEntry, Toolbox, ToolOptions
from gateway.tools.openapi.backend import OpenApiTools
from tests.openapi_service import PRODUCTS, ShopState, openapi_service


@pytest.fixture
async def shop() -> AsyncIterator[tuple[str, ShopState]]:
    async with openapi_service() as served:
        yield served


@asynccontextmanager
async def started(base_dir: Path = Path(), **fields: Any) -> AsyncIterator[OpenApiTools]:
    backend = OpenApiTools(OpenApiEntry(name="shop", **fields), base_dir)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.aclose()


async def start_fails(base_dir: Path = Path(), **fields: Any) -> str:
    backend = OpenApiTools(OpenApiEntry(name="shop", **fields), base_dir)
    with pytest.raises(ConfigError) as raised:
        await backend.start()
    await backend.aclose()
    return str(raised.value)


def by_name(backend: OpenApiTools) -> dict[str, ToolDef]:
    return {d.name: d for d in backend.definitions()}


def no_progress(payload: Any) -> None:
    raise AssertionError("an HTTP call reports no progress")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_each_operation_is_a_tool_with_refs_resolved(shop: tuple[str, ShopState]) -> None:
    url, _ = shop
    async with started(document=f"{url}/openapi.json") as backend:
        assert (backend.name, backend.kind, backend.prefix, backend.optional) == (
            "openapi:shop",
            "openapi",
            "shop",
            False,
        )
        tools = by_name(backend)
        assert list(tools) == [
            "list_products",
            "create_order",
            "get_order",
            "cancel_order",
            "wait_for_it",
            "who_am_i",
            "get_health",
        ]
        assert "$ref" not in json.dumps([d.input_schema for d in tools.values()])
        ToolRegistry(tools.values())  # every definition passes the gateway's checks

        products = tools["list_products"]
        assert products.description == "List products\n\nThe shop's products, filtered."
        assert products.display_name == "List products"
        assert products.read_only is True
        assert products.timeout is None
        assert products.output_schema is None
        assert products.input_schema == {
            "type": "object",
            "properties": {
                "category": {
                    "type": "string",
                    "enum": ["books", "games", "tools"],
                    "description": "Only products of this category.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "description": "At most this many products.",
                },
                "in_stock": {"type": "boolean"},
                "tag": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Products with any of these tags.",
                },
            },  # the cookie parameter is left out
            "required": [],
            "additionalProperties": False,
        }

        create = tools["create_order"]
        assert create.read_only is False
        assert create.input_schema["required"] == ["body"]
        body = create.input_schema["properties"]["body"]
        assert body["description"] == "The order to create."
        assert body["required"] == ["customer", "lines"]
        assert body["properties"]["lines"]["items"]["properties"]["quantity"] == {
            "type": "integer",
            "minimum": 1,
        }

        order = tools["get_order"]
        assert order.input_schema["required"] == ["order_id"]  # path-level, merged in
        assert set(order.input_schema["properties"]) == {"order_id", "X-Trace"}
        assert tools["cancel_order"].read_only is False
        assert tools["wait_for_it"].description == "Answers when it is ready."
        assert tools["get_health"].input_schema["properties"] == {}


async def test_a_get_sends_its_query_parameters(shop: tuple[str, ShopState]) -> None:
    url, _ = shop
    async with started(document=f"{url}/openapi.json") as backend:
        result = await backend.call(
            "list_products",
            {"category": "books", "in_stock": True, "tag": ["scifi", "classic"], "limit": 5},
            no_progress,
        )
    assert result == {
        "products": [PRODUCTS[0]],
        # In the document's order; arrays are repeated, booleans are true/false.
        "query": [
            ["category", "books"],
            ["limit", "5"],
            ["in_stock", "true"],
            ["tag", "scifi"],
            ["tag", "classic"],
        ],
    }


async def test_a_get_fills_its_path_and_sends_its_header(shop: tuple[str, ShopState]) -> None:
    url, state = shop
    async with started(document=f"{url}/openapi.json") as backend:
        result = await backend.call(
            "get_order", {"order_id": "o-100", "X-Trace": "t-1"}, no_progress
        )
    assert result == {**state.orders["o-100"], "trace": "t-1"}


async def test_a_post_sends_its_json_body_once(shop: tuple[str, ShopState]) -> None:
    url, state = shop
    new = {"customer": "Bo", "lines": [{"product_id": "p-3", "quantity": 1}]}
    async with started(document=f"{url}/openapi.json") as backend:
        created = await backend.call("create_order", {"body": new}, no_progress)
        assert created == {"id": "o-101", "note": None, **new, "status": "open"}
        assert state.created == 1
        assert await backend.call("get_order", {"order_id": "o-101"}, no_progress) == {
            **created,
            "trace": None,
        }
    assert state.created == 1


async def test_no_content_is_none_and_text_is_text(shop: tuple[str, ShopState]) -> None:
    url, state = shop
    async with started(document=f"{url}/openapi.json") as backend:
        assert await backend.call("cancel_order", {"order_id": "o-100"}, no_progress) is None
        assert await backend.call("get_health", {}, no_progress) == "ok"
    assert state.orders["o-100"]["status"] == "cancelled"


async def test_an_error_status_is_a_tool_error_with_an_excerpt(shop: tuple[str, ShopState]) -> None:
    url, _ = shop
    async with started(document=f"{url}/openapi.json") as backend:
        with pytest.raises(ToolError) as raised:
            # The space is URL-encoded in the path, and decoded by the API.
            await backend.call("get_order", {"order_id": "no such"}, no_progress)
    message = str(raised.value)
    prefix = "HTTP 404 Not Found: "
    assert message.startswith(
        prefix + """{ "error": "not_found", "message": "no order 'no such'", "hint": "Order"""
    )
    assert "\n" not in message
    assert "  " not in message
    assert len(message) == len(prefix) + 500
    assert message.endswith("…")


async def test_no_answer_in_time_is_a_tool_error(shop: tuple[str, ShopState]) -> None:
    url, state = shop
    async with started(document=f"{url}/openapi.json", timeout=0.3) as backend:
        with pytest.raises(ToolError, match=r"^no answer within 0\.3 s$"):
            await backend.call("wait_for_it", {}, no_progress)
    assert state.slow_started.is_set()


async def test_cancelling_a_call_cancels_the_request(shop: tuple[str, ShopState]) -> None:
    url, state = shop
    async with started(document=f"{url}/openapi.json") as backend:
        call = asyncio.create_task(backend.call("wait_for_it", {}, no_progress))
        await asyncio.wait_for(state.slow_started.wait(), 5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


async def test_the_toolbox_offers_and_calls_its_tools(shop: tuple[str, ShopState]) -> None:
    url, state = shop
    entry = OpenApiEntry(name="shop", document=f"{url}/openapi.json", operations=["getOrder"])
    toolbox = Toolbox([OpenApiTools(entry, Path())])
    await toolbox.start()
    try:
        assert [row.backend for row in toolbox.rows()] == ["openapi:shop"]
        result = await toolbox.call("get_order", {"order_id": "o-100"}, no_progress)
        assert result == {**state.orders["o-100"], "trace": None}
    finally:
        await toolbox.aclose()


async def test_no_connection_is_a_tool_error(tmp_path: Path) -> None:
    (tmp_path / "api.json").write_text(
        json.dumps(
            {
                "openapi": "3.0.3",
                "info": {"title": "Gone", "version": "1"},
                "paths": {"/ping": {"get": {"operationId": "ping"}}},
            }
        )
    )
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    async with started(tmp_path, document="api.json", base_url=base_url) as backend:
        with pytest.raises(ToolError, match=f"^cannot connect to 127.0.0.1:{port}: "):
            await backend.call("ping", {}, no_progress)


async def test_headers_take_environment_variables(
    shop: tuple[str, ShopState], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, state = shop
    document = f"{url}/openapi.json"
    async with started(document=document) as backend:
        with pytest.raises(ToolError, match=r"^HTTP 401 Unauthorized: .*bearer token"):
            await backend.call("who_am_i", {}, no_progress)

    monkeypatch.setenv("SHOP_TOKEN", state.token)
    headers = {"Authorization": "Bearer ${SHOP_TOKEN}"}
    async with started(document=document, headers=headers) as backend:
        assert await backend.call("who_am_i", {}, no_progress) == {"user": "agent"}

    monkeypatch.delenv("SHOP_TOKEN")
    with pytest.raises(ConfigError, match=r"^openapi:shop: .*Authorization.*SHOP_TOKEN is not set"):
        OpenApiTools(OpenApiEntry(name="shop", document=document, headers=headers), Path())


async def test_operations_selects_tools(shop: tuple[str, ShopState]) -> None:
    url, _ = shop
    document = f"{url}/openapi.json"
    chosen = ["getOrder", "POST /orders", "get /health"]
    async with started(document=document, operations=chosen) as backend:
        assert list(by_name(backend)) == ["create_order", "get_order", "get_health"]

    message = await start_fails(document=document, operations=["getOrder", "dropTables"])
    assert "'dropTables', which the document does not have" in message
    assert "listProducts, createOrder, getOrder" in message
    assert "GET /health" in message


async def test_tool_options_apply_by_tool_name(shop: tuple[str, ShopState]) -> None:
    url, _ = shop
    document = f"{url}/openapi.json"
    options = {"get_order": ToolOptions(timeout=3.0, display_name="Order", execution="async")}
    async with started(document=document, tool_options=options) as backend:
        tools = by_name(backend)
        assert (tools["get_order"].timeout, tools["get_order"].display_name) == (3.0, "Order")
        assert tools["get_order"].execution == "async"
        assert tools["list_products"].timeout is None

    message = await start_fails(document=document, tool_options={"getOrder": ToolOptions()})
    assert "tool_options names 'getOrder', which it does not offer" in message


SHOP_YAML = """\
openapi: 3.0.3
info: {title: Shop, version: "1"}
servers:
  - url: /api
paths:
  /orders/{order_id}:
    get:
      operationId: getOrder
      parameters:
        - name: order_id
          in: path
          required: true
          schema: {type: string}
  /trees/{id}:
    post:
      summary: Plant a tree
      parameters:
        - name: id
          in: path
          required: true
          schema: {type: string}
        - name: id
          in: query
          schema: {type: integer, nullable: true, minimum: 0, exclusiveMinimum: true}
      requestBody:
        content:
          application/merge-patch+json:
            schema: {$ref: '#/components/schemas/Tree'}
  /uploads:
    put:
      requestBody:
        required: true
        content:
          multipart/form-data:
            schema: {type: object}
components:
  schemas:
    Tree:
      type: object
      properties:
        name: {type: string, example: 2024-01-01}
        children:
          type: array
          items: {$ref: '#/components/schemas/Tree'}
"""


async def test_a_yaml_file_with_a_relative_server_takes_base_url(
    shop: tuple[str, ShopState], tmp_path: Path
) -> None:
    url, state = shop
    (tmp_path / "shop.yaml").write_text(SHOP_YAML)
    with capture_logs() as logs:
        async with started(tmp_path, document="shop.yaml", base_url=f"{url}/api") as backend:
            tools = by_name(backend)
            result = await backend.call("get_order", {"order_id": "o-100"}, no_progress)
    assert result == {**state.orders["o-100"], "trace": None}
    assert list(tools) == ["get_order", "post_trees_id"]
    skipped = [e for e in logs if e["event"] == "openapi_operation_skipped"]
    assert [(e["operation"], e["reason"]) for e in skipped] == [
        ("PUT /uploads", "its request body is not JSON (multipart/form-data)")
    ]

    trees = tools["post_trees_id"].input_schema
    # One name in two locations: each prefixed with its location.
    assert trees["required"] == ["path_id"]
    assert trees["properties"]["query_id"] == {  # OpenAPI 3.0's dialect as JSON Schema
        "type": ["integer", "null"],
        "exclusiveMinimum": 0,
    }
    tree = trees["properties"]["body"]
    assert tree["properties"]["name"]["example"] == "2024-01-01"  # YAML dates stay text
    # A recursive schema is unrolled once; below, anything goes.
    assert tree["properties"]["children"]["items"] == {}
    assert tools["post_trees_id"].description == "Plant a tree"
    assert tools["get_order"].description == "GET /orders/{order_id} on shop"

    message = await start_fails(tmp_path, document="shop.yaml")
    assert (
        message == "the document's server URL '/api' is not an absolute http(s) URL: set base_url"
    )

    message = await start_fails(
        tmp_path, document="shop.yaml", base_url=f"{url}/api", operations=["PUT /uploads"]
    )
    assert message == "operation PUT /uploads: its request body is not JSON (multipart/form-data)"


async def test_two_operations_with_one_tool_name_fail(tmp_path: Path) -> None:
    get = {"get": {"operationId": "getOrder"}}
    paths = {"/a": get, "/b": {"get": {"operationId": "get_order"}}}
    document = {"openapi": "3.1.0", "info": {"title": "x", "version": "1"}, "paths": paths}
    (tmp_path / "api.json").write_text(json.dumps(document))
    message = await start_fails(tmp_path, document="api.json", base_url="http://127.0.0.1:1")
    assert message == (
        "operations getOrder (GET /a) and get_order (GET /b) would both be tool 'get_order'"
    )


async def test_an_unreachable_document_fails_to_start(tmp_path: Path) -> None:
    document = f"http://127.0.0.1:{free_port()}/openapi.json"
    message = await start_fails(document=document)
    assert message.startswith(f"document {document}: cannot fetch it: ")

    message = await start_fails(tmp_path, document="missing.yaml")
    missing = tmp_path / "missing.yaml"
    assert message == f"cannot read the document {missing}: No such file or directory"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '{"swagger": "2.0", "paths": {}}',
            "a Swagger 2.0 document, not OpenAPI 3.x (convert it, e.g. with swagger2openapi)",
        ),
        ("openapi: 2.9\npaths: {}\n", "OpenAPI 2.9, not 3.x"),
        ("- openapi\n- 3.1.0\n", "not an OpenAPI document (it is an array)"),
        ("info: {title: x}\n", "not an OpenAPI document (no 'openapi' field)"),
        ("openapi: [3.1\n", "neither JSON nor YAML (while parsing a flow sequence)"),
    ],
)
async def test_a_document_that_is_not_openapi_3_fails_to_start(
    tmp_path: Path, text: str, problem: str
) -> None:
    (tmp_path / "api.yaml").write_text(text)
    message = await start_fails(tmp_path, document="api.yaml", base_url="http://127.0.0.1:1")
    assert message == f"document {tmp_path / 'api.yaml'}: {problem}"


async def test_a_document_url_that_is_not_openapi_fails_to_start(
    shop: tuple[str, ShopState],
) -> None:
    url, _ = shop
    message = await start_fails(document=f"{url}/api/health")
    assert message == f"document {url}/api/health: not an OpenAPI document (it is a string)"
    message = await start_fails(document=f"{url}/api/nowhere")
    assert message == f"document {url}/api/nowhere: HTTP 404 Not Found: Not Found"
