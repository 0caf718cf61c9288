"""What the judging knows and collects: protected paths, the working directory, the reasons so far."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Context:
    protected: tuple[str, ...]
    exists: Callable[[str], bool] | None
    cwd: str | None
    reasons: list[str] = field(default_factory=list)

    def add(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)

    def resolve(self, path: str) -> str | None:
        """``path`` made absolute, or None when that depends on something we cannot see."""
        if not path or path.startswith(("~", "$")) or (path[0] != "/" and self.cwd is None):
            return None
        return normalise(posixpath.join(self.cwd or "/", path))

    def protected_hit(self, path: str, *, ancestors: bool = False) -> str | None:
        """The resolved ``path`` if it lies under a protected path (or, with ancestors, holds one)."""
        resolved = self.resolve(path)
        if resolved is None:
            return None
        for root in self.protected:
            if _inside(resolved, root) or (ancestors and _inside(root, resolved)):
                return resolved
        return None

    def overwrites(self, path: str) -> str | None:
        """The resolved ``path`` if writing it clobbers a protected file (one that exists, if we can tell)."""
        hit = self.protected_hit(path)
        try:
            return None if hit is None or (self.exists is not None and not self.exists(hit)) else hit
        except OSError:
            return hit  # cannot tell: assume the file is there


def normalise(path: str) -> str:
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("/") else path


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
