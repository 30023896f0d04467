"""Gateway nodes as real processes (``python -m gateway serve``) on one redis-server.

The test binds each node's port (127.0.0.1, a port the kernel picks) and hands the
listening socket over with ``--fd``: no two processes race for a port, and clients may
connect before the node is up (they wait in the backlog). The test's own copy of the
socket is closed once the node has it, so a node that is killed refuses connections at
once, as a crashed host does; ``start`` again binds the same port anew.

Each node writes its log (stdout and stderr) to ``<dir>/<name>.log``; ``Cluster.report``
gives their tails for a failure message (tests/conftest.py adds it to failed tests).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from client_sdk import Conversation
from gateway.store.redis import RedisStore
from gateway.wire.v1 import ServerMsg
from tests.nginx import nginx_in_front

__all__ = [
    "CLUSTER_AGENT",
    "Cluster",
    "Node",
    "adoptions",
    "behind_nginx",
    "collect",
    "owner",
    "owners_store",
    "running_cluster",
]

ROOT = Path(__file__).parents[1]
CLUSTER_AGENT = ROOT / "tests" / "data" / "cluster_agent.toml"
READY_TIMEOUT = 20.0
"""Seconds a node has to answer ``/readyz`` (Python's imports on a busy 2-core machine)."""
EXIT_TIMEOUT = 30.0
"""Seconds a node stopped with SIGTERM has to exit (its grace, then its sockets' close)."""
_POLL = 0.02
_LOG_TAIL = 4_000
"""Characters of each node's log shown when a test fails."""


class Node:
    """One gateway process.

    Args:
        name: its ``--node-id`` and log file name.
        directory: where its log goes.
        args: the arguments of ``gateway serve`` besides ``--fd`` and ``--node-id``.
        env: its environment.
    """

    def __init__(self, name: str, directory: Path, args: Sequence[str], env: dict[str, str]):
        self.name = name
        self.log = directory / f"{name}.log"
        self._args = list(args)
        self._env = env
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Bind (the same port again on a restart) and spawn the node; see ``wait_ready``."""
        assert not self.alive, f"{self.name} runs already"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            # A restart binds the port the nginx config names; connections of the killed
            # node may linger in TIME_WAIT, which SO_REUSEADDR allows.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            sock.listen(1024)
            self.port = sock.getsockname()[1]
            with self.log.open("ab") as log:
                log.write(f"--- start {self.starts + 1} of {self.name}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [
                        sys.executable, "-m", "gateway", "serve",
                        "--fd", str(sock.fileno()),
                        "--node-id", self.name,
                        *self._args,
                    ],
                    cwd=ROOT,
                    env=self._env,
                    pass_fds=[sock.fileno()],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            self.starts += 1
        finally:
            sock.close()  # the node has its own copy: once it dies, the port refuses

    async def wait_ready(self) -> None:
        """Poll ``/readyz`` until it answers 200 (the store answers too).

        Raises:
            AssertionError: the node exited, or was not ready within ``READY_TIMEOUT``
                seconds; with its log.
        """
        try:
            async with asyncio.timeout(READY_TIMEOUT), httpx.AsyncClient(timeout=2.0) as client:
                while True:
                    assert self.alive, f"{self.name} exited ({self.returncode}):\n{self.tail()}"
                    try:
                        if (await client.get(f"{self.url}/readyz")).status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass  # bound, so connecting works; answering waits for the app
                    await asyncio.sleep(_POLL)  # polling a condition, under the deadline
        except TimeoutError:
            raise AssertionError(
                f"{self.name} not ready within {READY_TIMEOUT} s:\n{self.tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lease released, as when the host dies."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    async def terminate(self) -> int:
        """SIGTERM, as a deploy stops a node: its graceful shutdown (sessions handed over);
        its exit code once it exited (within ``EXIT_TIMEOUT`` seconds)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, EXIT_TIMEOUT)

    def stop(self) -> None:
        """Stop the node if it runs (SIGKILL; graceful stops are ``terminate``)."""
        if self.alive:
            self.kill()

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return text[-_LOG_TAIL:]

    async def metric(self, name: str) -> float:
        """The value of an unlabelled sample of ``/metrics`` (0 if absent)."""
        async with httpx.AsyncClient(timeout=5.0) as client:
            text = (await client.get(f"{self.url}/metrics")).text
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return float(value)
        return 0.0


class Cluster:
    """``count`` gateway nodes serving ``agent`` on the store at ``store_url``.

    Args:
        directory: for the nodes' logs and the tools' runs file.
        store_url: the redis-server's URL, shared by every node.
        count: how many nodes.
        args: more ``gateway serve`` arguments, for every node.
        auth: the arguments that set every node's authentication: ``--no-auth`` unless
            given (say ``["--api-keys-file", path, "--token-secret", secret]``).
    """

    def __init__(
        self,
        directory: Path,
        store_url: str,
        *,
        count: int = 3,
        agent: Path = CLUSTER_AGENT,
        lease_ttl: float = 1.0,
        args: Sequence[str] = (),
        auth: Sequence[str] = ("--no-auth",),
    ) -> None:
        self.directory = directory
        self.runs = directory / "runs.txt"
        self.runs.touch()
        env = {**os.environ, "CLUSTER_RUNS": str(self.runs), "PYTHONUNBUFFERED": "1"}
        env = {k: v for k, v in env.items() if not k.startswith("GATEWAY_")}
        common = [
            "--store", store_url,
            "--agent", str(agent),
            "--lease-ttl", str(lease_ttl),
            *auth,
            "--max-sockets-per-ip", "100000",
            *args,
        ]  # fmt: skip
        self.nodes = [Node(f"n{i + 1}", directory, common, env) for i in range(count)]

    async def start(self) -> None:
        """Start every node and wait until all are ready."""
        for node in self.nodes:
            node.start()
        await asyncio.gather(*(node.wait_ready() for node in self.nodes))

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def run_lines(self) -> list[str]:
        """Every tool run so far, one line each, on any node."""
        return self.runs.read_text().splitlines()

    def report(self) -> str:
        """The tails of the nodes' logs, for a failure message."""
        return "\n".join(
            f"===== {node.name} (port {node.port}, exit {node.returncode}):\n{node.tail()}"
            for node in self.nodes
        )


@asynccontextmanager
async def running_cluster(
    directory: Path, store_url: str, **options: Any
) -> AsyncIterator[Cluster]:
    """The nodes of a ``Cluster`` (three unless ``options`` say otherwise: its keyword
    arguments) started and ready; SIGKILLed on the way out."""
    nodes = Cluster(directory, store_url, **options)
    try:
        await nodes.start()
        yield nodes
    finally:
        nodes.stop()


@asynccontextmanager
async def behind_nginx(
    cluster: Cluster, directory: Path, *, sticky: bool, worker_connections: int = 2048
) -> AsyncIterator[str]:
    """The ``ws://`` URL of /v1/realtime through nginx in front of every node: the shipped
    deploy/nginx.conf, sticky by session or (``sticky=False``) round robin."""
    run_dir = directory / "nginx"
    run_dir.mkdir()
    async with nginx_in_front(
        cluster.ports, run_dir, worker_connections=worker_connections, sticky=sticky
    ) as port:
        yield f"ws://127.0.0.1:{port}/v1/realtime"


@asynccontextmanager
async def owners_store(store_url: str) -> AsyncIterator[RedisStore]:
    """The store as the nodes see it: ``owner(session_id)`` names the node driving it."""
    store = RedisStore.from_url(store_url, session_ttl=120, lease_ttl=1)
    try:
        yield store
    finally:
        await store.aclose()


async def owner(store: RedisStore, conv: Conversation) -> str:
    """The node driving ``conv``'s session."""
    assert conv.session is not None
    node = await store.owner(conv.session.session_id)
    assert node is not None
    return node


async def adoptions(cluster: Cluster) -> int:
    """Sessions taken over from another node so far, on every live node."""
    counts = [await n.metric("gateway_sessions_adopted_total") for n in cluster.nodes if n.alive]
    return int(sum(counts))


async def collect(
    conv: Conversation, done: Callable[[list[ServerMsg]], bool]
) -> asyncio.Task[list[ServerMsg]]:
    """A task gathering ``conv``'s events (subscribed before this returns) until ``done``."""

    async def gather() -> list[ServerMsg]:
        events: list[ServerMsg] = []
        async for event in conv.events():
            events.append(event)
            if done(events):
                break
        return events

    task = asyncio.create_task(gather())
    await asyncio.sleep(0)  # the task subscribes at its first step, before any await
    return task
