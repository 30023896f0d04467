"""Debian's redis-server on a unix socket in a temporary directory, for tests.

``make test`` installs it when missing; the tests never use a system service. The server
keeps nothing on disk (``--save ''``, no AOF) unless asked for an append-only file, and
listens on no TCP port, so tests never race for ports. ``restart`` stops it and starts a
new one on the same socket: every client connection is cut, as when Redis restarts in
production, and every key is gone (with ``appendonly``, every key is back).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["REDIS_SERVER", "RedisServer", "redis_server"]

REDIS_SERVER = Path("/usr/bin/redis-server")
START_TIMEOUT = 10.0


class RedisServer:
    """One redis-server process on ``<directory>/redis.sock``.

    Args:
        directory: where the socket (and, with ``appendonly``, the data) lives.
        appendonly: log every write to an append-only file, fsynced before the reply
            (``appendfsync always``), so the data survive a SIGKILL and a restart.
    """

    def __init__(self, directory: Path, *, appendonly: bool = False) -> None:
        self.directory = directory
        self.appendonly = appendonly
        self.socket = directory / "redis.sock"
        self.url = f"unix://{self.socket}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and return once it answers PING.

        Raises:
            RuntimeError: it exited or did not answer within ``START_TIMEOUT`` seconds.
        """
        assert REDIS_SERVER.exists(), (
            f"{REDIS_SERVER} is missing: `make test` installs it (apt-get install redis-server)"
        )
        self._proc = subprocess.Popen(
            [
                str(REDIS_SERVER),
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", "always",
                "--daemonize", "no",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer within {START_TIMEOUT} s")
            time.sleep(0.01)  # polling a condition with a deadline, not a blind wait

    def stop(self) -> None:
        """Kill the server (SIGKILL: as abrupt as a crash) and wait for it to exit."""
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.wait(timeout=10)
        if self._proc.stderr:
            self._proc.stderr.close()
        self._proc = None
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, then start again on the same socket (with no data, unless ``appendonly``)."""
        self.stop()
        self.start()

    def flushall(self) -> None:
        """Drop every key (between tests sharing one server)."""
        assert self._command(b"FLUSHALL") == b"+OK\r\n"

    def _answers(self) -> bool:
        try:
            return self._command(b"PING") == b"+PONG\r\n"
        except OSError:
            return False

    def _command(self, command: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(command + b"\r\n")
            return sock.recv(64)


@contextmanager
def redis_server(directory: Path, *, appendonly: bool = False) -> Iterator[RedisServer]:
    """A started ``RedisServer`` in ``directory``, killed on exit."""
    server = RedisServer(directory, appendonly=appendonly)
    server.start()
    try:
        yield server
    finally:
        server.stop()
