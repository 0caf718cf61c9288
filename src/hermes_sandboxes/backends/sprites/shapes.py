"""The shapes of the Sprites API's answers, as the published sources show them, read leniently.

Where two sources disagree, both shapes are accepted (docs/sprites.md says which source shows what):

* the exec session list (``GET /v1/sprites/{name}/exec``): a bare array (the API reference's example)
  or an object ``{"sessions": [...]}`` (sprites-go, sprites-py); each session's command as one string
  ``command`` (sprites-go's ``Session``) or, in older documents, a list ``cmd``;
* checkpoint create (``POST .../checkpoint``): an NDJSON progress stream whose new id appears only in
  the text of a message, "Checkpoint v8 created" (the API reference; the CLI prints "Checkpoint
  created: v8");
* the checkpoint list: ``id``, ``create_time``, ``comment``, ``health``, ``source_id`` (the API
  reference), ``is_auto`` (sprites-go); automatic ones have ``auto-`` ids.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_CREATED = (re.compile(r"\bCheckpoint\s+(?!created\b)([A-Za-z0-9][\w.:-]*)\s+created\b", re.IGNORECASE),
            re.compile(r"\bCheckpoint\s+created:\s*([A-Za-z0-9][\w.:-]*)", re.IGNORECASE))
AUTO_PREFIX = "auto-"


@dataclass(frozen=True)
class ExecSession:
    id: str
    words: tuple[str, ...]  # the command line, word by word
    active: bool


def exec_sessions(data: Any) -> list[ExecSession]:
    """The sessions of a session-list answer, whichever published envelope and command form."""
    items = data.get("sessions") if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        return []
    found = []
    for item in items:
        if not isinstance(item, Mapping) or item.get("id") in (None, ""):
            continue
        found.append(ExecSession(id=str(item["id"]), words=_words(item.get("command", item.get("cmd"))),
                                 active=bool(item.get("is_active", True))))
    return found


def _words(command: Any) -> tuple[str, ...]:
    if isinstance(command, list):
        return tuple(str(part) for part in command)
    if not isinstance(command, str):
        return ()
    try:
        return tuple(shlex.split(command))
    except ValueError:  # an unbalanced quote: the service's own joining, not a shell line
        return tuple(part.strip("'\"") for part in command.split())


def created_checkpoint_id(messages: Iterable[Mapping[str, Any]]) -> str | None:
    """The id a checkpoint-create stream announces in a message's text, or None."""
    for message in messages:
        text = str(message.get("data") or "")
        for pattern in _CREATED:
            found = pattern.search(text)
            if found:
                return found.group(1).rstrip(".")
    return None


def ndjson(text: str) -> list[dict[str, Any]]:
    """The JSON objects of an NDJSON body (a JSON array of them is taken too); other lines skipped."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            whole = json.loads(stripped)
        except ValueError:
            whole = None
        if isinstance(whole, list):
            return [m for m in whole if isinstance(m, dict)]
    messages = []
    for line in stripped.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            messages.append(value)
    return messages


def stream_error(messages: Iterable[Mapping[str, Any]]) -> str | None:
    for message in messages:
        if message.get("type") == "error":
            return str(message.get("error") or message.get("data") or "error")
    return None


@dataclass(frozen=True)
class ListedCheckpoint:
    id: str
    created_at: float
    comment: str
    auto: bool
    healthy: bool


def listed_checkpoints(data: Any) -> list[ListedCheckpoint]:
    items = data.get("checkpoints") if isinstance(data, Mapping) else data
    found = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping) or not item.get("id"):
            continue
        cid = str(item["id"])
        found.append(ListedCheckpoint(
            id=cid, created_at=timestamp(item.get("create_time")), comment=str(item.get("comment") or ""),
            auto=bool(item.get("is_auto")) or cid.startswith(AUTO_PREFIX),
            healthy=not item.get("health")))  # empty is healthy; "mount_failed" is not
    return found


def timestamp(value: Any) -> float:
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
