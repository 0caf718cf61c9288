"""Make raw system calls and report what the kernel answered (a standalone script, no imports of ours).

``python3 syscall_probe.py JSON`` where JSON is a list of ``[label, name, number, args, in_child]``. Each
argument is an integer, a string (passed as a NUL-terminated byte string), null (a NULL pointer) or
``{"buf": N}`` (a zeroed buffer of N bytes). A call marked ``in_child`` is made in a forked child
(for calls that would change the prober, such as unshare), which reports through its exit status.
Prints a JSON object: label -> 0 when the call succeeded, else the errno it failed with. Descriptors
a successful call returns are closed; a process a successful clone made exits at once.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _arg(value: object) -> ctypes.c_void_p | ctypes.c_char_p | ctypes.Array[ctypes.c_char] | ctypes.c_long:
    if value is None:
        return ctypes.c_void_p(0)
    if isinstance(value, str):
        return ctypes.c_char_p(value.encode())
    if isinstance(value, dict):
        return ctypes.create_string_buffer(int(value["buf"]))
    return ctypes.c_long(int(value))  # type: ignore[call-overload]  # an int from the JSON plan


def call(name: str, number: int, args: list[object]) -> int:
    result = libc.syscall(ctypes.c_long(number), *[_arg(a) for a in args])
    if result < 0:
        return ctypes.get_errno()
    if name in ("clone",) and result == 0:
        os._exit(0)  # the new process: leave at once
    if name in ("clone",):
        os.waitpid(result, 0)
    elif name in ("io_uring_setup", "userfaultfd", "socket", "fsopen", "open_tree", "fspick", "pidfd_getfd"):
        os.close(result)
    return 0


def in_child(name: str, number: int, args: list[object]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(min(call(name, number, args), 255))
        finally:
            os._exit(255)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    out: dict[str, int] = {}
    for label, name, number, args, child in json.loads(sys.argv[1]):
        out[label] = in_child(name, number, args) if child else call(name, number, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
