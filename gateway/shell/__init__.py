"""The asyncio shell around the core: the session registry, drivers, connections,
queues, observers and metrics. No Starlette, no uvicorn.
"""

__all__: list[str] = []
