"""Client SDK for the conversation gateway (Python; the browser module is in ``js/``).

``connect`` gives a ``Conversation``: client functions, streamed replies, server tools in
manual tool mode, the user's confirmation of tool calls and answers to widget tools, and a
socket that survives drops.
``connect_raw`` is the typed low-level connection.
"""

from client_sdk.client import Conversation, ToolMode, connect
from client_sdk.confirm import Approve, ConfirmHandler, Decline
from client_sdk.connection import Connection, connect_raw
from client_sdk.events import EventStream
from client_sdk.exceptions import ClientError, ResumeGap, ServerError, SessionClosed
from client_sdk.server_tools import RUN_ON_GATEWAY, RunOnGateway, ServerToolHandler
from client_sdk.widgets import WidgetHandler

__all__ = [
    "RUN_ON_GATEWAY",
    "Approve",
    "ClientError",
    "ConfirmHandler",
    "Connection",
    "Conversation",
    "Decline",
    "EventStream",
    "ResumeGap",
    "RunOnGateway",
    "ServerError",
    "ServerToolHandler",
    "SessionClosed",
    "ToolMode",
    "WidgetHandler",
    "connect",
    "connect_raw",
]
