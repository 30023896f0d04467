"""An HTTP API described by an OpenAPI 3.x document as a tool backend: the document, one
call of an operation, the backend.
"""

__all__: list[str] = []
