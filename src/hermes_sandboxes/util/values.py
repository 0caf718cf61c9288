"""Value classes for the modules on the CLI's hot path: ``dataclass`` without its start-up cost.

A CLI ``exec`` is one short process, and it imports the contract, the journal, the recorder and the
local backend's host side: some thirty value classes. The standard library's ``dataclasses`` costs
~5 ms to import (it pulls in inspect, ast, dis, tokenize) and ~0.5 ms per class, because it writes
each class's methods as source text and compiles them, at every start. That was a third of an
exec's start-up. This module's ``dataclass`` gives a class the same methods (``__init__`` with the same signature
rules, ``__repr__``, ``__eq__``, ``__hash__``, frozen ``__setattr__``/``__delattr__``,
``__match_args__``) as closures over its field list, built in microseconds.

They stay dataclasses to everyone else: type checkers read them as such (``dataclass_transform``),
and ``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work on them, because
their ``__dataclass_fields__`` is made by the real module (from a twin of the class) the first time
anyone asks. Supported: ``frozen``, ``kw_only``, defaults, ``field(default_factory=...)``,
``ClassVar`` annotations and inheritance; a module needing more uses ``dataclasses`` itself.

The start-up idioms, documented here once: this ``dataclass``, and ``TYPE_CHECKING = False`` (the
name type checkers know, without importing ``typing``, which costs a CLI exec ~2 ms) with the
imports only annotations need under it. They are for the measured hot modules only: what a CLI
``exec`` imports in-process (the CLI's entry and fast path, its session and running, the contract,
the recorder, the registry, the local backend's client and sandbox side), the warm exec server and
its worker (``cli/fastpath/``), the MCP server's start-up (``cli/fastpath/mcp.py``, ``mcp/``), the
start of a sandbox's init (its fork server and user namespace) and what runs inside the sandbox
(``backends/local/guest/``).
Everywhere else the code is ordinary Python (``typing.TYPE_CHECKING``, ``dataclasses``).
tests/cli/test_cli_robust.py checks that every module using them is one of those.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing; type checkers know the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> Callable[[T], T]:
        return lambda decorated: decorated


_MISSING: Any = object()
_FIELDS = "__value_fields__"


class _Field:
    """One field: name, default (or factory), keyword-only, and its annotation (for the twin)."""

    __slots__ = ("annotation", "default", "factory", "kw_only", "name")

    def __init__(self, default: Any = _MISSING, factory: Callable[[], Any] | None = None) -> None:
        self.name = ""
        self.annotation = ""
        self.default = default
        self.factory = factory
        self.kw_only = False


def field(*, default_factory: Callable[[], T]) -> T:
    """A field whose default is made anew for each instance (``dataclasses.field(default_factory=)``)."""
    made: Any = _Field(factory=default_factory)
    return made  # type: ignore[no-any-return]  # a marker the class decorator replaces


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen value (as ``dataclasses.FrozenInstanceError``)."""


@dataclass_transform(field_specifiers=(field,))
def dataclass(*, frozen: bool = False, kw_only: bool = False) -> Callable[[type[T]], type[T]]:
    """The decorator, as ``dataclasses.dataclass`` with those options (always called: ``@dataclass()``)."""

    def decorate(cls: type[T]) -> type[T]:
        fields = _collect(cls, kw_only)
        methods: dict[str, Any] = {
            _FIELDS: fields, "__init__": _init(fields), "__repr__": _repr, "__eq__": _eq,
            "__match_args__": tuple(f.name for f in fields if not f.kw_only),
            "__dataclass_fields__": _Twin("__dataclass_fields__", frozen),
            "__dataclass_params__": _Twin("__dataclass_params__", frozen),
        }
        if frozen:
            methods |= {"__hash__": _hash, "__setattr__": _frozen_setattr, "__delattr__": _frozen_delattr}
        elif "__hash__" not in cls.__dict__:
            methods["__hash__"] = None  # mutable and compared by value: unhashable, as a dataclass
        for name, method in methods.items():
            setattr(cls, name, method)
        return cls

    return decorate


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of value ``obj`` with ``changes`` (``dataclasses.replace``, without importing it)."""
    given = {f.name: getattr(obj, f.name) for f in getattr(type(obj), _FIELDS)}
    return type(obj)(**(given | changes))


def _collect(cls: type, kw_only: bool) -> tuple[_Field, ...]:
    """The fields of ``cls``: its bases' first, then its own annotations in order (as dataclasses)."""
    fields: dict[str, _Field] = {}
    for base in reversed(cls.__mro__[1:]):
        fields.update((f.name, f) for f in base.__dict__.get(_FIELDS, ()))
    own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - inspect is what we avoid importing
    for name, annotation in own.items():
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        if text.startswith(("ClassVar", "typing.ClassVar")):
            continue
        default = cls.__dict__.get(name, _MISSING)
        made = default if isinstance(default, _Field) else _Field(default)
        made.name, made.annotation, made.kw_only = name, annotation, kw_only
        if made.default is _MISSING:
            if name in cls.__dict__:
                delattr(cls, name)  # a factory's marker: instances get their own value
        else:
            setattr(cls, name, made.default)
        fields[name] = made
    return tuple(fields.values())


def _init(fields: tuple[_Field, ...]) -> Callable[..., None]:
    positional = tuple(f.name for f in fields if not f.kw_only)
    by_name = {f.name: f for f in fields}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(positional):
            raise TypeError(f"{type(self).__name__}() takes {len(positional)} positional arguments "
                            f"but {len(args)} were given")
        for name in kwargs:
            if name not in by_name:
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {name!r}")
        given = dict(zip(positional, args, strict=False))
        for name in given.keys() & kwargs.keys():
            raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
        given.update(kwargs)
        state = self.__dict__
        for f in fields:
            if f.name in given:
                state[f.name] = given[f.name]
            elif f.factory is not None:
                state[f.name] = f.factory()
            elif f.default is not _MISSING:
                state[f.name] = f.default
            else:
                raise TypeError(f"{type(self).__name__}() missing required argument: {f.name!r}")

    return __init__


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in getattr(type(self), _FIELDS))


def _repr(self: Any) -> str:
    inner = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in getattr(type(self), _FIELDS))
    return f"{type(self).__qualname__}({inner})"


def _eq(self: Any, other: object) -> object:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


class _Twin:
    """``__dataclass_fields__`` / ``__dataclass_params__``, made on first access by the real
    ``dataclasses`` from a twin class with the same fields, then kept on the class."""

    def __init__(self, attribute: str, frozen: bool) -> None:
        self.attribute = attribute
        self.frozen = frozen

    def __get__(self, instance: object, owner: type) -> Any:
        import dataclasses

        namespace: dict[str, Any] = {"__annotations__": {}, "__module__": owner.__module__}
        for f in getattr(owner, _FIELDS):
            namespace["__annotations__"][f.name] = f.annotation
            default = dataclasses.MISSING if f.default is _MISSING else f.default
            namespace[f.name] = dataclasses.field(
                default=default, default_factory=f.factory or dataclasses.MISSING, kw_only=f.kw_only)
        twin: Any = dataclasses.dataclass(frozen=self.frozen)(type(owner.__name__, (), namespace))
        for attribute in ("__dataclass_fields__", "__dataclass_params__"):
            setattr(owner, attribute, getattr(twin, attribute))
        return getattr(twin, self.attribute)
