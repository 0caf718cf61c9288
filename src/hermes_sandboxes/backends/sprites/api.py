"""The Sprites REST API as the backend uses it: the sprites-py SDK, its errors mapped to ours.

Every SDK call goes through ``API.call``, which turns SDK exceptions into the package's error
classes by cause (authentication, not found, rate limit, unreachable...), retries the calls that
are safe to repeat when the service says "later" (429, 5xx, a lost connection), and removes the
token from every message. sprites-py 0.7.2 reports most HTTP failures as ``SpriteError("Failed ...
(status N): <body>")`` without a status attribute, so the status and a JSON body's
``retry_after_seconds`` are read back from that text (pinned SDK version: the wording is stable).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx
from sprites import SpritesClient
from sprites.exceptions import (
    APIError,
    AuthenticationError,
    FileNotFoundError_,
    FilesystemError,
    NetworkError,
    NotFoundError,
    SpriteError,
)

from hermes_sandboxes.errors import (
    AuthenticationFailed,
    InvalidInput,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    SandboxExists,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxUnreachable,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_STATUS_RE = re.compile(r"\(status (\d{3})\)(?::\s*(.*))?", re.DOTALL)
MAX_RETRY_SLEEP_S = 10.0
TOKEN_HINT = "check SPRITES_TOKEN (or SPRITE_TOKEN)"


class API:
    """One SDK client (one connection pool) and the rules for calling it."""

    def __init__(self, token: str, base_url: str, *, timeout: float = 30.0, attempts: int = 3) -> None:
        self.token = token
        self.base_url = base_url.rstrip("/")
        self.client = SpritesClient(token, base_url=self.base_url, timeout=timeout)
        self.attempts = attempts

    def close(self) -> None:
        self.client.close()

    def redact(self, text: str) -> str:
        return text.replace(self.token, "[redacted]") if self.token else text

    def call(self, what: str, fn: Callable[[], T], *, sprite: str | None = None, retry: bool = True) -> T:
        """Run ``fn`` (an SDK call); on a retryable failure try again (``retry``: the call is safe
        to repeat), honouring the service's Retry-After up to MAX_RETRY_SLEEP_S."""
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:
                error = self.translate(exc, what, sprite)
                if not (retry and error.retryable and attempt < self.attempts):
                    raise error from None
                pause = getattr(error, "retry_after", None) or 0.25 * 2**attempt
                log.info("sprites: %s failed (%s); retrying in %.1fs", what, error, pause)
                time.sleep(min(pause, MAX_RETRY_SLEEP_S))
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, what: str, *, sprite: str | None = None, retry: bool = True,
                json_body: Any = None, params: Mapping[str, str] | None = None,
                timeout: float | None = None) -> httpx.Response:
        """One REST request through the SDK's authenticated client (for the answers whose published
        shapes the SDK does not read: see shapes.py); a status of 400 or more is our error."""
        options: dict[str, Any] = {"params": params}
        if json_body is not None:
            options["json"] = json_body
        if timeout is not None:
            options["timeout"] = timeout

        def send() -> httpx.Response:
            response: httpx.Response = getattr(self.client.http_client, method.lower())(
                f"{self.base_url}{path}", **options)
            if response.status_code >= 400:
                raise self.from_status(response.status_code, response.text, what, sprite, headers=response.headers)
            return response

        return self.call(what, send, sprite=sprite, retry=retry)

    def translate(self, exc: BaseException, what: str, sprite: str | None) -> SandboxError:
        """The package error for an SDK (or httpx) exception, its message without the token."""
        where = f"Sprite {sprite}: " if sprite else "Sprites: "
        if isinstance(exc, SandboxError):
            return exc
        if isinstance(exc, AuthenticationError):
            return AuthenticationFailed(f"{where}{what} was refused: the token is not accepted; {TOKEN_HINT}")
        if isinstance(exc, FileNotFoundError_):
            return SandboxFileNotFound(self.redact(f"{where}{exc}"))
        if isinstance(exc, NotFoundError):
            return SandboxNotFound(f"{where}{what}: not found" if sprite is None else f"no Sprite named {sprite}")
        if isinstance(exc, APIError) and exc.status_code is not None:
            return self.from_status(exc.status_code, str(exc.response or exc), what, sprite,
                                    retry_after=exc.get_retry_after_seconds())
        if isinstance(exc, NetworkError | httpx.TransportError | OSError | TimeoutError):
            return SandboxUnreachable(self.redact(f"{where}{what} failed: cannot reach the Sprites API at "
                                                  f"{self.base_url} ({exc}); try again"))
        if isinstance(exc, FilesystemError):
            return SandboxError(self.redact(f"{where}{what} failed: {exc}"))
        if isinstance(exc, SpriteError):
            found = _STATUS_RE.search(str(exc))
            if found:
                return self.from_status(int(found.group(1)), found.group(2) or "", what, sprite)
            return SandboxError(self.redact(f"{where}{what} failed: {exc}"))
        return SandboxError(self.redact(f"{where}{what} failed: {type(exc).__name__}: {exc}"))

    def from_status(self, status: int, body: str, what: str, sprite: str | None, *,
                    retry_after: float | None = None, headers: Mapping[str, str] | None = None) -> SandboxError:
        where = f"Sprite {sprite}: " if sprite else "Sprites: "
        detail = _detail(body)
        if retry_after is None:
            retry_after = _retry_after(body, headers or {})
        text = self.redact(f"{where}{what} failed (HTTP {status}{': ' + detail if detail else ''})")
        if status in (401, 403):
            return AuthenticationFailed(f"{where}{what} was refused (HTTP {status}); {TOKEN_HINT}")
        if status == 404:
            return SandboxNotFound(f"no Sprite named {sprite}" if sprite else text)
        if status == 409:
            return SandboxExists(text)
        if status == 429:
            code = _code(body)
            why = {"sprite_creation_rate_limited": "; too many Sprites created in a short time",
                   "concurrent_sprite_limit_exceeded": "; the organization runs as many Sprites as it may"}
            hint = f"; retry in {retry_after:g}s" if retry_after else "; retry later"
            return RateLimited(text + why.get(code, "") + hint, retry_after=retry_after)
        if status == 402 or "limit_exceeded" in body:
            return QuotaExceeded(text + "; free up Sprites or raise the organization's limits")
        if status in (400, 422):
            return InvalidInput(text)
        if status >= 500:
            return SandboxUnreachable(text + "; the Sprites API had a problem, try again")
        return SandboxError(text)


def _code(body: str) -> str:
    """The machine-readable ``error`` code of a JSON error body, or ""."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    return str(data.get("error") or "") if isinstance(data, dict) else ""


def _detail(body: str) -> str:
    """The message of a JSON error body (or its start), for one-line errors."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("error") or "")[:200]
    return ""


def _retry_after(body: str, headers: Mapping[str, str]) -> float | None:
    """The wait a 429 asks for: the body's ``retry_after_seconds``, else the ``Retry-After`` header
    (sprites-go's ``GetRetryAfterSeconds`` order)."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = None
    value = data.get("retry_after_seconds") if isinstance(data, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    for key in ("retry-after", "Retry-After"):
        if key in headers:
            try:
                return float(headers[key])
            except ValueError:
                pass
    return None
