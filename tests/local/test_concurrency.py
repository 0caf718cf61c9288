"""Many sandboxes at once: created and used concurrently from threads, each isolated from the others."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from tests.local.kit import fresh_name

COUNT = 20


def test_twenty_sandboxes_created_and_run_concurrently_all_succeed(local_backend: LocalBackend) -> None:
    names = [fresh_name() for _ in range(COUNT)]
    created: dict[str, LocalSandbox] = {}

    def create_and_run(name: str) -> tuple[str, str, int]:
        sb = local_backend.create(name)
        created[name] = sb
        result = sb.exec(f"echo {name} > /root/mine; hostname; ls /root; ps -e --no-headers | wc -l",
                         timeout=120)
        return name, result.stdout, result.exit_code

    try:
        with ThreadPoolExecutor(COUNT) as pool:
            results = list(pool.map(create_and_run, names))
        for name, stdout, code in results:
            assert code == 0, (name, stdout)
            hostname, listing, processes = stdout.split()
            assert (hostname, listing) == (name, "mine")  # its own name, only its own file
            assert int(processes) <= 4  # init, bash, ps, wc: no other sandbox's processes
        assert set(names) <= set(local_backend.names())
        with ThreadPoolExecutor(COUNT) as pool:  # and again, now that all of them run
            again = list(pool.map(lambda n: created[n].read_file("/root/mine").decode().strip(), names))
        assert again == names
    finally:
        with ThreadPoolExecutor(COUNT) as pool:
            list(pool.map(lambda sb: sb.destroy(), created.values()))
    assert not set(names) & set(local_backend.names())
