"""A small real HTTP API (a shop) that publishes its own OpenAPI 3.1 document.

``openapi_service()`` runs it with uvicorn in the test's event loop, on a free port, and
yields its base URL and its ``ShopState``. The document is at ``{url}/openapi.json``; its
server URL is relative (``/api``), so the gateway resolves it against the document's URL.

Operations: ``listProducts`` (GET, query parameters), ``getOrder`` (GET, a path parameter
and a header one), ``createOrder`` (POST, a JSON body, 201, counted), ``cancelOrder``
(DELETE, 204), ``waitForIt`` (GET, answers when the test sets ``state.release``),
``whoAmI`` (GET, 401 without ``Authorization: Bearer {state.token}``) and ``GET /health``
(no operationId, plain text).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["PRODUCTS", "ShopState", "create_app", "document", "openapi_service"]

PRODUCTS: list[dict[str, Any]] = [
    {"id": "p-1", "name": "Dune", "category": "books", "in_stock": True, "tags": ["scifi"]},
    {"id": "p-2", "name": "Emma", "category": "books", "in_stock": False, "tags": ["classic"]},
    {"id": "p-3", "name": "Go", "category": "games", "in_stock": True, "tags": ["classic"]},
    {"id": "p-4", "name": "Saw", "category": "tools", "in_stock": True, "tags": []},
]
CATEGORIES = ["books", "games", "tools"]


@dataclass
class ShopState:
    token: str = "letmein"
    """``whoAmI`` wants ``Authorization: Bearer {token}``."""
    orders: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "o-100": {
                "id": "o-100",
                "customer": "Ada",
                "lines": [{"product_id": "p-1", "quantity": 2}],
                "note": None,
                "status": "open",
            }
        }
    )
    created: int = 0
    """How many times ``createOrder`` ran."""
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when ``waitForIt`` is waiting."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """``waitForIt`` answers once this is set (the server sets it when it stops)."""


def document() -> dict[str, Any]:
    """The shop's OpenAPI 3.1 document, written by hand."""
    order = {"$ref": "#/components/schemas/Order"}
    error = {"$ref": "#/components/responses/Error"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Shop", "version": "1.0.0"},
        "servers": [{"url": "/api"}],
        "paths": {
            "/products": {
                "get": {
                    "operationId": "listProducts",
                    "summary": "List products",
                    "description": "The shop's products, filtered.",
                    "parameters": [
                        {"$ref": "#/components/parameters/Category"},
                        {
                            "name": "limit",
                            "in": "query",
                            "description": "At most this many products.",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 50},
                        },
                        {"name": "in_stock", "in": "query", "schema": {"type": "boolean"}},
                        {
                            "name": "tag",
                            "in": "query",
                            "description": "Products with any of these tags.",
                            "schema": {"type": "array", "items": {"type": "string"}},
                        },
                        {"name": "session", "in": "cookie", "schema": {"type": "string"}},
                    ],
                    "responses": {"200": {"description": "The products."}, "400": error},
                }
            },
            "/orders": {
                "post": {
                    "operationId": "createOrder",
                    "summary": "Create an order",
                    "requestBody": {
                        "required": True,
                        "description": "The order to create.",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/NewOrder"}
                            }
                        },
                    },
                    "responses": {
                        "201": {
                            "description": "Created.",
                            "content": {"application/json": {"schema": order}},
                        },
                        "400": error,
                    },
                }
            },
            "/orders/{order_id}": {
                "parameters": [
                    {
                        "name": "order_id",
                        "in": "path",
                        "required": True,
                        "description": "The order's id.",
                        "schema": {"type": "string"},
                    }
                ],
                "get": {
                    "operationId": "getOrder",
                    "summary": "Get an order",
                    "parameters": [
                        {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {
                            "description": "The order.",
                            "content": {"application/json": {"schema": order}},
                        },
                        "404": error,
                    },
                },
                "delete": {
                    "operationId": "cancelOrder",
                    "summary": "Cancel an order",
                    "responses": {"204": {"description": "Cancelled."}, "404": error},
                },
            },
            "/slow": {
                "get": {
                    "operationId": "waitForIt",
                    "description": "Answers when it is ready.",
                    "responses": {"200": {"description": "Ready."}},
                }
            },
            "/me": {
                "get": {
                    "operationId": "whoAmI",
                    "summary": "Who the caller is",
                    "security": [{"bearer": []}],
                    "responses": {"200": {"description": "The caller."}, "401": error},
                }
            },
            "/health": {
                "get": {
                    "summary": "Health check",
                    "responses": {
                        "200": {
                            "description": "ok",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {
            "parameters": {
                "Category": {
                    "name": "category",
                    "in": "query",
                    "description": "Only products of this category.",
                    "schema": {"$ref": "#/components/schemas/Category"},
                }
            },
            "schemas": {
                "Category": {"type": "string", "enum": CATEGORIES},
                "OrderLine": {
                    "type": "object",
                    "properties": {
                        "product_id": {"type": "string"},
                        "quantity": {"type": "integer", "minimum": 1},
                    },
                    "required": ["product_id", "quantity"],
                    "additionalProperties": False,
                },
                "NewOrder": {
                    "type": "object",
                    "properties": {
                        "customer": {"type": "string"},
                        "lines": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/OrderLine"},
                            "minItems": 1,
                        },
                        "note": {"type": ["string", "null"]},
                    },
                    "required": ["customer", "lines"],
                    "additionalProperties": False,
                },
                "Order": {
                    "allOf": [
                        {"$ref": "#/components/schemas/NewOrder"},
                        {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string"},
                                "status": {"enum": ["open", "cancelled"]},
                            },
                        },
                    ]
                },
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                },
            },
            "responses": {
                "Error": {
                    "description": "What went wrong.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _error(status: int, error: str, message: str, **extra: Any) -> Response:
    # Pretty-printed, as many APIs answer: the gateway's excerpt collapses the whitespace.
    body = json.dumps({"error": error, "message": message, **extra}, indent=2)
    return Response(body, status_code=status, media_type="application/json")


def create_app(state: ShopState) -> Starlette:
    """The shop, serving ``state``; ``app.state.shop`` is ``state`` too."""

    async def openapi(request: Request) -> Response:
        return JSONResponse(document())

    async def list_products(request: Request) -> Response:
        query = request.query_params
        products = PRODUCTS
        if (category := query.get("category")) is not None:
            if category not in CATEGORIES:
                return _error(400, "bad_request", f"unknown category {category!r}")
            products = [p for p in products if p["category"] == category]
        if (in_stock := query.get("in_stock")) is not None:
            if in_stock not in ("true", "false"):  # what OpenAPI's form style sends
                return _error(400, "bad_request", f"in_stock: {in_stock!r} is not a boolean")
            products = [p for p in products if p["in_stock"] == (in_stock == "true")]
        if tags := query.getlist("tag"):
            products = [p for p in products if set(tags) & set(p["tags"])]
        if (limit := query.get("limit")) is not None:
            if not limit.isdigit():
                return _error(400, "bad_request", f"limit: {limit!r} is not an integer")
            products = products[: int(limit)]
        return JSONResponse({"products": products, "query": query.multi_items()})

    async def create_order(request: Request) -> Response:
        state.created += 1
        if request.headers.get("content-type") != "application/json":
            return _error(415, "unsupported_media_type", "send JSON")
        new = await request.json()
        order_id = f"o-{100 + len(state.orders)}"
        state.orders[order_id] = {"id": order_id, "note": None, **new, "status": "open"}
        return JSONResponse(state.orders[order_id], status_code=201)

    async def get_order(request: Request) -> Response:
        order_id = request.path_params["order_id"]
        if order_id not in state.orders:
            return _error(
                404,
                "not_found",
                f"no order {order_id!r}",
                hint="Order ids look like o-100; list your orders to find one. " * 12,
            )
        return JSONResponse({**state.orders[order_id], "trace": request.headers.get("x-trace")})

    async def cancel_order(request: Request) -> Response:
        order_id = request.path_params["order_id"]
        if order_id not in state.orders:
            return _error(404, "not_found", f"no order {order_id!r}")
        state.orders[order_id]["status"] = "cancelled"
        return Response(status_code=204)

    async def wait_for_it(request: Request) -> Response:
        state.slow_started.set()
        await state.release.wait()
        return JSONResponse({"ready": True})

    async def who_am_i(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {state.token}":
            return _error(401, "unauthorized", "a bearer token is required")
        return JSONResponse({"user": "agent"})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/openapi.json", openapi),
            Route("/api/products", list_products),
            Route("/api/orders", create_order, methods=["POST"]),
            Route("/api/orders/{order_id}", get_order, methods=["GET"]),
            Route("/api/orders/{order_id}", cancel_order, methods=["DELETE"]),
            Route("/api/slow", wait_for_it),
            Route("/api/me", who_am_i),
            Route("/api/health", health),
        ]
    )
    app.state.shop = state
    return app


@asynccontextmanager
async def openapi_service(token: str = "letmein") -> AsyncIterator[tuple[str, ShopState]]:
    """The shop served by uvicorn in this event loop on a free port.

    Yields:
        Its base URL (``http://127.0.0.1:PORT``; the document is at ``/openapi.json``)
        and its state.
    """
    state = ShopState(token=token)
    app = create_app(state)
    # Listening before uvicorn starts: clients queue in the backlog, no polling for readiness.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", state
    finally:
        state.release.set()  # a waiting waitForIt would hold the shutdown
        server.should_exit = True
        await task
        sock.close()
