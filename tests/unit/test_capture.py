"""Bounded capture: a command's output costs bounded memory whatever its size, head and tail kept."""

from __future__ import annotations

import pytest

from hermes_sandboxes.sandbox import Sandbox
from hermes_sandboxes.util.capture import BoundedCapture


def test_small_output_is_kept_whole() -> None:
    capture = BoundedCapture(100)
    capture.write(b"hello ")
    capture.write(b"world")
    assert capture.bytes() == b"hello world"
    assert not capture.truncated


def test_long_output_keeps_head_and_tail_and_says_how_much_was_dropped() -> None:
    capture = BoundedCapture(20)
    for i in range(1000):
        capture.write(f"{i:04d}\n".encode())
    text = capture.text()
    assert capture.truncated
    assert text.startswith("0000\n0001")
    assert text.endswith("0998\n0999\n")
    assert f"[... {capture.total - 20} bytes omitted ...]" in text


def test_one_huge_chunk_is_cut_to_the_limit() -> None:
    capture = BoundedCapture(10)
    capture.write(b"a" * 5 + b"b" * 1000 + b"c" * 5)
    assert capture.bytes().startswith(b"aaaaa")
    assert capture.bytes().endswith(b"ccccc")
    assert capture.total == 1010


def test_a_limit_below_two_bytes_is_refused() -> None:
    with pytest.raises(ValueError):
        BoundedCapture(1)


def test_exec_of_a_command_printing_200_mb_keeps_memory_bounded(sandbox: Sandbox) -> None:
    streamed = 0

    def count(chunk: bytes) -> None:
        nonlocal streamed
        streamed += len(chunk)

    result = sandbox.exec("head -c 200000000 /dev/zero | tr '\\0' x; echo; echo END", on_stdout=count,
                          capture_limit=64 * 1024, timeout=120)
    assert result.exit_code == 0
    assert streamed == 200_000_000 + len("\nEND\n")  # every byte reached the streaming sink
    assert result.truncated
    assert len(result.stdout) < 64 * 1024 + 100  # only head, marker and tail are held
    assert result.stdout.endswith("\nEND\n")
