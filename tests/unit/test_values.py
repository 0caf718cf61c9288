"""hermes_sandboxes.util.values: value classes that behave as the standard library's dataclasses."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, ClassVar

import pytest

from hermes_sandboxes.util.values import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Base:
    KIND: ClassVar[str] = "base"
    sandbox: str
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Child(Base):
    KIND: ClassVar[str] = "child"
    command: str
    exit_code: int | None = None


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0


@dataclass()
class Mutable:
    items: list[str] = field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StdPoint:
    x: int
    y: int = 0


def test_a_value_compares_hashes_and_prints_as_a_dataclass_would() -> None:
    assert Point(1, 2) == Point(x=1, y=2) == Point(1, y=2)
    assert Point(1) != Point(1, 1)
    assert Point(1, 2) != StdPoint(1, 2)  # type: ignore[comparison-overlap]
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert len({Point(1, 2), Point(1, 2), Point(2, 1)}) == 2
    assert repr(Point(1, 2)) == repr(StdPoint(1, 2)).replace("StdPoint", "Point")
    assert repr(Child(sandbox="a", command="ls")) == (
        "Child(sandbox='a', tags={}, command='ls', exit_code=None)")
    assert Point.__match_args__ == ("x", "y")


def test_a_frozen_value_refuses_assignment_and_deletion() -> None:
    point = Point(1, 2)
    with pytest.raises(AttributeError):
        point.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del point.y
    assert point == Point(1, 2)


def test_a_mutable_value_is_unhashable_and_each_instance_gets_its_own_default() -> None:
    first, second = Mutable(), Mutable()
    first.items.append("x")
    assert second.items == []
    second.items = ["y"]
    assert second == Mutable(["y"])
    with pytest.raises(TypeError):
        hash(first)


def test_inherited_keyword_only_fields_come_first_and_class_variables_are_not_fields() -> None:
    child = Child(sandbox="a", command="ls", exit_code=0)
    assert (child.sandbox, child.command, child.exit_code, child.tags) == ("a", "ls", 0, {})
    assert Child.KIND == "child" and Base.KIND == "base"
    assert [f.name for f in dataclasses.fields(Child)] == ["sandbox", "tags", "command", "exit_code"]
    assert Child(sandbox="a", command="ls").tags is not Child(sandbox="a", command="ls").tags


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {}, "missing required argument: 'x'"),
    ((1, 2, 3), {}, "takes 2 positional arguments but 3 were given"),
    ((1,), {"x": 2}, "multiple values for argument 'x'"),
    ((1,), {"z": 2}, "unexpected keyword argument 'z'"),
])
def test_a_wrong_call_is_a_type_error_as_with_a_dataclass(args: tuple[int, ...], kwargs: dict[str, int],
                                                          message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Point(*args, **kwargs)
    with pytest.raises(TypeError):
        StdPoint(*args, **kwargs)


def test_keyword_only_fields_refuse_positional_arguments() -> None:
    with pytest.raises(TypeError, match="takes 0 positional arguments"):
        make: Any = Child  # (a type checker refuses the call itself)
        make("a", "ls")


def test_the_dataclasses_functions_work_on_values() -> None:
    child = Child(sandbox="a", command="ls")
    assert dataclasses.is_dataclass(child) and dataclasses.is_dataclass(Child)
    assert dataclasses.asdict(child) == {"sandbox": "a", "tags": {}, "command": "ls", "exit_code": None}
    changed = dataclasses.replace(child, exit_code=1)
    assert type(changed) is Child and changed.exit_code == 1 and changed.command == "ls"
    assert dataclasses.replace(Point(1, 2), y=5) == Point(1, 5)
    assert dataclasses.astuple(Point(1, 2)) == (1, 2)
    assert Point.__dataclass_params__.frozen and not Mutable.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_values_survive_pickling() -> None:
    child = Child(sandbox="a", command="ls", tags={"k": "v"})
    assert pickle.loads(pickle.dumps(child)) == child
