"""Tools of an MCP server as a tool backend: the connection, what its answers mean, the
backend.
"""

__all__: list[str] = []
