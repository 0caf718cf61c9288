"""Network modes: `none` has no usable network, `loopback` has its own lo only, `host` shares the host's.

The test process serves a TCP port and an abstract unix socket on the host; what the sandbox can
reach of them shows which network namespace it is in.
"""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.sandbox import SandboxSpec
from tests.local.kit import new_sandbox, sh


@dataclass
class HostServer:
    port: int
    abstract: str
    greeting: bytes
    connections: list[str] = field(default_factory=list)


def _serve(listener: socket.socket, server: HostServer, label: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed at teardown
        server.connections.append(label)
        with conn:
            conn.sendall(server.greeting)


@pytest.fixture(scope="module")
def host_server() -> Iterator[HostServer]:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    abstract = f"hsl-{secrets.token_hex(6)}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0" + abstract)
    unix.listen(8)
    server = HostServer(tcp.getsockname()[1], abstract, f"host-{secrets.token_hex(4)}\n".encode())
    threads = [threading.Thread(target=_serve, args=(s, server, label), daemon=True)
               for s, label in ((tcp, "tcp"), (unix, "unix"))]
    for t in threads:
        t.start()
    try:
        yield server
    finally:
        for s in (tcp, unix):
            s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in threads:
            t.join(5)


CONNECT_TCP = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
print(s.recv(64).decode().strip())
"""
CONNECT_ABSTRACT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(3)
s.connect("\\0" + sys.argv[1])
print(s.recv(64).decode().strip())
"""


def _connect_tcp(port: int) -> list[str]:
    return ["python3", "-c", CONNECT_TCP, str(port)]


def _connect_abstract(name: str) -> list[str]:
    return ["python3", "-c", CONNECT_ABSTRACT, name]


OWN_LOOPBACK = r"""
import socket
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname(), timeout=3)
conn, _ = srv.accept(); conn.sendall(b"inside-pong")
print(cli.recv(64).decode())
"""


@pytest.fixture(scope="module")
def by_mode(local_backend: LocalBackend) -> Iterator[dict[str, LocalSandbox]]:
    with new_sandbox(local_backend, SandboxSpec(network="none")) as none, \
            new_sandbox(local_backend, SandboxSpec(network="loopback")) as loopback, \
            new_sandbox(local_backend, SandboxSpec(network="host")) as host:
        yield {"none": none, "loopback": loopback, "host": host}


def test_network_none_cannot_reach_a_server_on_the_host_loopback(by_mode: dict[str, LocalSandbox],
                                                                 host_server: HostServer) -> None:
    before = len(host_server.connections)
    result = by_mode["none"].exec(_connect_tcp(host_server.port))
    assert result.exit_code != 0
    assert host_server.greeting.decode().strip() not in result.stdout
    assert "unreachable" in result.stderr  # lo is down: not even a refusal
    assert len(host_server.connections) == before


def test_network_none_has_only_a_loopback_interface_that_is_down(by_mode: dict[str, LocalSandbox]) -> None:
    assert sh(by_mode["none"], "ls /sys/class/net").stdout.split() == ["lo"]
    assert by_mode["none"].exec(["python3", "-c", OWN_LOOPBACK]).exit_code != 0


def test_network_none_cannot_reach_host_abstract_unix_sockets(by_mode: dict[str, LocalSandbox],
                                                              host_server: HostServer) -> None:
    before = len(host_server.connections)
    result = by_mode["none"].exec(_connect_abstract(host_server.abstract))
    assert result.exit_code != 0 and "Connection refused" in result.stderr
    assert len(host_server.connections) == before


def test_loopback_mode_has_a_working_lo_of_its_own(by_mode: dict[str, LocalSandbox]) -> None:
    assert sh(by_mode["loopback"], f"python3 -c '{OWN_LOOPBACK}'").stdout.strip() == "inside-pong"
    assert sh(by_mode["loopback"], "ls /sys/class/net").stdout.split() == ["lo"]


def test_loopback_mode_still_cannot_reach_the_host_server(by_mode: dict[str, LocalSandbox],
                                                          host_server: HostServer) -> None:
    before = len(host_server.connections)
    tcp = by_mode["loopback"].exec(_connect_tcp(host_server.port))
    assert tcp.exit_code != 0 and "Connection refused" in tcp.stderr  # its own lo: nobody listens
    unix = by_mode["loopback"].exec(_connect_abstract(host_server.abstract))
    assert unix.exit_code != 0
    assert len(host_server.connections) == before


def test_host_mode_reaches_the_host_server(by_mode: dict[str, LocalSandbox], host_server: HostServer) -> None:
    before = len(host_server.connections)
    result = by_mode["host"].exec(_connect_tcp(host_server.port))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.encode() == host_server.greeting
    unix = by_mode["host"].exec(_connect_abstract(host_server.abstract))  # same script as the refusals
    assert unix.exit_code == 0 and unix.stdout.encode() == host_server.greeting, unix.stderr
    assert len(host_server.connections) == before + 2


def test_host_mode_keeps_the_other_isolation(by_mode: dict[str, LocalSandbox]) -> None:
    """Sharing the network does not share the rest: /sys stays read-only with no cgroup mounts."""
    result = by_mode["host"].exec("ls -A /sys/fs/cgroup; touch /sys/hsl; echo rc=$?; ls -A /root")
    assert result.stdout.split() == ["rc=1"], result.stdout


SNIFF = """
import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # every frame, any protocol
print("raw packet socket opened")
"""


def test_host_mode_cannot_sniff_the_host_s_traffic(by_mode: dict[str, LocalSandbox]) -> None:
    result = by_mode["host"].exec(["python3", "-c", SNIFF])
    assert result.exit_code != 0 and "PermissionError" in result.stderr, result.stdout
