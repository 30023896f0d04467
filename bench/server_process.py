"""Servers under test as processes of their own, pinned to a CPU, and what they cost.

The benchmark binds each server's port (127.0.0.1, a port the kernel picks) and hands
the listening socket over (``--fd``): no two processes race for a port. A server is
ended (SIGTERM, then SIGKILL) when its ``with`` block ends, whatever happened inside.
On a machine with two CPUs or more, servers run on CPU 0 and the load generator (this
process, ``pin_self``) on CPU 1; on one CPU nothing is pinned.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "CLIENT_CPU",
    "SERVER_CPU",
    "OtherLoad",
    "Server",
    "cpu_seconds",
    "gateway",
    "machine",
    "pin_self",
    "pinning",
    "placement",
    "profiled",
    "self_cpu_seconds",
    "server",
]

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU = 0
CLIENT_CPU = 1
READY_TIMEOUT = 30.0
"""Seconds a server has to answer its readiness URL (imports on a busy 2-core machine)."""
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


_PINNING = {SERVER_CPU, CLIENT_CPU} <= os.sched_getaffinity(0)
"""Both CPUs are there (read before ``pin_self`` narrows this process's own set)."""


def pinning() -> bool:
    """Whether servers and the load generator get a CPU each."""
    return _PINNING


def pin_self(cpu: int = CLIENT_CPU) -> None:
    """Run this process (the load generator) on ``cpu`` alone, when there are two CPUs."""
    if pinning():
        os.sched_setaffinity(0, {cpu})


def machine() -> str:
    """CPUs, CPU model and Python: the line every benchmark prints first."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {model}, Python {sys.version.split()[0]}"


def placement(**where: int) -> str:
    """``gateway on CPU 0, load generator on CPU 1``, or that nothing is pinned."""
    if not pinning():
        return "nothing pinned (fewer than two CPUs)"
    return ", ".join(f"{name.replace('_', ' ')} on CPU {cpu}" for name, cpu in where.items())


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` (all its threads), from /proc."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    fields = data[data.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def self_cpu_seconds() -> float:
    """User plus system CPU time of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_busy_seconds() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system = (int(f) for f in fields[:3])
    return (user + nice + system) / _CLOCK_TICKS


class OtherLoad:
    """The CPU this machine gave processes other than the benchmark's own meanwhile (others
    may be benchmarking on the same cores: a run they shared says so)."""

    def __init__(self, *pids: int) -> None:
        self._pids = pids
        self._start = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        ours = self_cpu_seconds() + sum(cpu_seconds(pid) for pid in self._pids)
        return time.perf_counter(), _machine_busy_seconds(), ours

    def start(self) -> None:
        self._start = self._now()

    def percent(self) -> float:
        """Since ``start``: CPU of the other processes, in per cent of one core."""
        wall, busy, ours = (b - a for a, b in zip(self._start, self._now(), strict=True))
        return max(0.0, busy - ours) / wall * 100


@dataclass
class Server:
    """A running server process."""

    pid: int
    port: int

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    with httpx.Client(timeout=2.0) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: exited with {proc.returncode}:\n{_tail(log)}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # bound, so connecting works; answering waits for the app
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: not ready within {READY_TIMEOUT} s:\n{_tail(log)}")
            time.sleep(0.02)  # polling a condition, under the deadline


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@contextmanager
def server(
    argv: Sequence[str],
    *,
    ready_path: str,
    env: dict[str, str] | None = None,
    cpu: int = SERVER_CPU,
) -> Iterator[Server]:
    """Run ``argv`` plus ``--fd N`` (a listening socket) on ``cpu`` until the block ends.

    Args:
        argv: the command, which must serve HTTP on the socket it is given.
        ready_path: a path that answers 200 once the server is up.
        env: extra environment variables.
        cpu: where it runs (when there are two CPUs).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    pin = pinning()
    with tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log") as raw_log:
        log = Path(raw_log.name)
        try:
            proc = subprocess.Popen(
                [*argv, "--fd", str(sock.fileno())],
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                pass_fds=[sock.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=raw_log,
                stderr=subprocess.STDOUT,
                # this process has no threads when it starts a server
                preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if pin else None,
            )
        finally:
            sock.close()  # the server has its own copy
        try:
            _wait_ready(proc, f"http://127.0.0.1:{port}{ready_path}", log)
            yield Server(pid=proc.pid, port=port)
        finally:
            _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def gateway(agent: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """``gateway serve`` with ``agent``: memory store, no auth, warnings only, no rate limit
    worth the name (the benchmarks send a frame every few hundred microseconds)."""
    argv = [
        sys.executable, "-m", "gateway", "serve",
        "--agent", str(agent), "--no-auth", "--store", "memory",
        "--log-level", "warning", "--first-message-timeout", "600",
        "--max-messages-per-second", "1000000", "--max-message-burst", "1000000",
        *extra,
    ]  # fmt: skip
    with server(argv, ready_path="/readyz", env=env) as running:
        yield running


@contextmanager
def profiled(pid: int, output: Path | None) -> Iterator[None]:
    """py-spy (if ``output`` is given) sampling ``pid`` while the block runs, written as
    collapsed stacks (``--format raw``) to ``output``.

    py-spy is not a dependency: ``.venv/bin/pip install py-spy``. It samples without
    stopping the process (``--nonblocking``), at a cost of a few per cent of a core.
    """
    if output is None:
        yield
        return
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        raise RuntimeError(f"--profile needs py-spy: {sys.executable} -m pip install py-spy")
    proc = subprocess.Popen(
        [str(spy), "record", "--pid", str(pid), "--format", "raw", "--nonblocking",
         "--rate", "500", "--output", str(output)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
