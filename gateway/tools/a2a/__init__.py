"""A remote agent spoken to over A2A as a tool backend: what its replies mean (``reply``),
the backend (``backend``).
"""

__all__: list[str] = []
