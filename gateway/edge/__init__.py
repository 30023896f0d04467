"""The HTTP and WebSocket edge: Starlette routes, the socket endpoints and their shared
handshake, HTTP auth, uvicorn's protocols.
"""

__all__: list[str] = []
