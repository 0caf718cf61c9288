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
        result = sb.exec(f"echo {name} > /root/mine; hostname; ls /root; "
                         "ps -e --no-headers -o pid=,args= | awk '$1 == 1 || $2 != \"hermes-sandboxes-init\"' | wc -l",
                         timeout=120)
        return name, result.stdout, result.exit_code

    try:
        with ThreadPoolExecutor(COUNT) as pool:
            results = list(pool.map(create_and_run, names))
        for name, stdout, code in results:
            assert code == 0, (name, stdout)
            hostname, listing, processes = stdout.split()
            assert (hostname, listing) == (name, "mine")  # its own name, only its own file
            # init, bash, ps, awk, wc (not the init's stubs, which carry its command line): no
            # other sandbox's processes
            assert int(processes) <= 5
        assert set(names) <= set(local_backend.names())
        with ThreadPoolExecutor(COUNT) as pool:  # and again, now that all of them run
            again = list(pool.map(lambda n: created[n].read_file("/root/mine").decode().strip(), names))
        assert again == names
    finally:
        with ThreadPoolExecutor(COUNT) as pool:
            list(pool.map(lambda sb: sb.destroy(), created.values()))
    assert not set(names) & set(local_backend.names())


def test_opening_one_name_from_many_threads_creates_it_once(local_backend: LocalBackend) -> None:
    name = fresh_name()
    try:
        with ThreadPoolExecutor(8) as pool:
            opened = list(pool.map(lambda _: local_backend.open(name), range(8)))
        assert local_backend.names().count(name) == 1
        opened[0].write_file("/root/shared", b"one sandbox\n")
        with ThreadPoolExecutor(8) as pool:
            seen = list(pool.map(lambda sb: sb.read_file("/root/shared"), opened))
        assert seen == [b"one sandbox\n"] * 8
        inits = {sb.exec("cat /proc/1/stat").stdout.split()[21] for sb in opened}  # one init start time
        assert len(inits) == 1
    finally:
        local_backend.get(name).destroy()


def test_checkpoints_taken_concurrently_on_one_sandbox_are_all_valid(local_backend: LocalBackend) -> None:
    sb = local_backend.create(fresh_name())
    try:
        sb.exec("echo base > /root/base")
        with ThreadPoolExecutor(6) as pool:
            made = list(pool.map(lambda i: sb.checkpoint(f"c{i}"), range(6)))
        assert sorted(c.id for c in sb.checkpoints()) == sorted(c.id for c in made)
        assert len({c.id for c in made}) == 6
        sb.exec("rm /root/base")
        sb.restore(made[3].id)
        assert sb.read_file("/root/base") == b"base\n"
    finally:
        sb.destroy()
