"""The compiled seccomp program itself, run on chosen inputs by a small classic-BPF interpreter.

What a real process cannot easily try from Python (a 32-bit or x32 system call, a call newer than
the kernel) is checked here on the very program every sandbox gets. The interpreter knows only the
instructions libseccomp emits for this policy and fails on any other, so it cannot quietly
misread the program. test_escapes.py checks the same program against the real kernel.
"""

from __future__ import annotations

import errno
import os
import struct

import pytest

from hermes_sandboxes.backends.local import syscall_filter

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
X32_BIT = 0x40000000
ALLOW = 0x7FFF0000


def errno_action(code: int) -> int:
    return 0x00050000 | code


def run_filter(program: bytes, nr: int, arch: int = AUDIT_ARCH_X86_64, args: tuple[int, ...] = ()) -> int:
    """The action the program returns for struct seccomp_data {nr, arch, ip, args[6]}."""
    full_args = (list(args) + [0] * 6)[:6]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *full_args)
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    for _ in range(100_000):
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x05:  # ja
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        elif code == 0x06:  # ret #k
            return int(k)
        else:
            raise AssertionError(f"instruction {code:#x} at {pc - 1} is not one this interpreter knows")
    raise AssertionError("the program did not return")


pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64",
                                reason="the system call numbers below are x86_64's")
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17


@pytest.fixture(scope="module")
def program() -> bytes:
    return syscall_filter.compiled()


def test_ordinary_calls_are_allowed(program: bytes) -> None:
    for nr in (0, 1, 39, 57, 59, 257):  # read, write, getpid, fork, execve, openat
        assert run_filter(program, nr) == ALLOW, nr
    assert run_filter(program, 56, args=(SIGCHLD,)) == ALLOW  # clone as fork does it
    assert run_filter(program, 135, args=(0xFFFFFFFF,)) == ALLOW  # personality query


def test_denied_calls_get_eperm_and_clone3_enosys(program: bytes) -> None:
    for nr in (272, 165, 250, 425, 323, 321):  # unshare, mount, keyctl, io_uring_setup, userfaultfd, bpf
        assert run_filter(program, nr) == errno_action(errno.EPERM), nr
    assert run_filter(program, 56, args=(CLONE_NEWUSER | SIGCHLD,)) == errno_action(errno.EPERM)
    assert run_filter(program, 435) == errno_action(errno.ENOSYS)  # clone3


def test_32_bit_x32_and_unknown_calls_are_refused(program: bytes) -> None:
    assert run_filter(program, 20, arch=AUDIT_ARCH_I386) == errno_action(errno.ENOSYS)  # getpid, i386
    assert run_filter(program, 1, arch=AUDIT_ARCH_I386) == errno_action(errno.ENOSYS)
    assert run_filter(program, X32_BIT | 39) == errno_action(errno.ENOSYS)  # getpid through x32
    assert run_filter(program, 1000) == errno_action(errno.ENOSYS)  # newer than libseccomp knows
