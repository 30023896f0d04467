"""What went wrong with a model request, in words a user can act on.

Every failure names the URL (without its query) and the cause: ``cannot reach URL:
connection refused``, ``URL did not answer within 15 s``, ``HTTP 401 from URL: <the vendor's
message>``. ``Attempt`` is one failed try, saying whether sending the request again may help;
the retry loop (``gateway.providers.http``) turns the last one into a ``ProviderError``.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from gateway.errors import ProviderError

__all__ = [
    "RETRYABLE_STATUSES",
    "Attempt",
    "display_url",
    "retry_after",
    "seconds",
    "transport_cause",
    "vendor_message",
]

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class Attempt(ProviderError):
    """One failed try of a model request.

    Attributes:
        retry: sending the same request again may work (nothing of the step was sent yet
            is checked by the caller, not here).
        reason: a few words for ``response.retrying`` (``HTTP 429``, ``connection refused``).
        kind: what failed, for the retries metric (``http_429``, ``ConnectError``...); not
            ``label``, which names the error's row of the close table (``provider_error``).
        delay: how long the server asked to wait (``Retry-After``), if it did.
        retryable: whether the client may try later (what ``error.retryable`` says);
            ``retry`` by default.
    """

    def __init__(
        self,
        message: str,
        *,
        retry: bool,
        reason: str,
        kind: str,
        delay: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.retry = retry
        self.retryable = retry if retryable is None else retryable
        self.reason = reason
        self.kind = kind
        self.delay = delay

    def after(self, attempts: int, secret: str | None) -> ProviderError:
        """The error to report when this was the last of ``attempts`` tries, without
        ``secret`` (the API key, should a server echo it)."""
        message = str(self)
        if attempts > 1:
            message += f" ({attempts} attempts)"
        if secret:
            message = message.replace(secret, "***")
        error = ProviderError(message)
        error.retryable = self.retryable
        return error


def display_url(url: str) -> str:
    """``url`` as errors and logs show it: no user, password or query (keys hide there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def seconds(value: float) -> str:
    """``15 s``, ``0.5 s``: a duration as the messages write it."""
    return f"{value:g} s"


def transport_cause(exc: Exception) -> str:
    """Why a connection failed, from the OS error under the client's (``connection refused``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return f"cannot resolve the host ({seen.strerror or seen})"
        if isinstance(seen, ssl.SSLError):  # its errno is OpenSSL's, not the OS's
            return f"TLS failed ({(seen.reason or str(seen)).lower().replace('_', ' ')})"
        if isinstance(seen, OSError) and seen.errno is not None:
            return os.strerror(seen.errno).lower()
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "All connection attempts failed" in text:
        return "connection refused"
    return text.lower() if text else type(exc).__name__


def vendor_message(body: bytes, limit: int = 300) -> str:
    """The message inside an error body (``{"error": {"message": ...}}`` and its kin),
    else the start of the body as text."""
    text = body.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:limit] or "(empty body)"
    for _ in range(3):  # {"error": {"message": "..."}}, {"error": "..."}, {"message": ...}
        if isinstance(value, list) and value:
            value = value[0]  # Gemini may wrap its error in a list
        if not isinstance(value, dict):
            break
        value = value.get("error", value.get("message", value.get("detail", value)))
        if isinstance(value, str):
            break
    if isinstance(value, str):
        return value[:limit]
    return json.dumps(value)[:limit]


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms``, else ``Retry-After`` (seconds
    or an HTTP date); None when it asks nothing. ``headers``' names are in lower case."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    header = headers.get("retry-after")
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
