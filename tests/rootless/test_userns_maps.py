"""newuidmap and newgidmap as a normal user: both maps written (the tools run at once), and a map
the user's /etc/subuid block does not allow refused with the tool's own words."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from tests.rootless import kit

SCRIPT = textwrap.dedent("""
    import json, os
    from hermes_sandboxes.backends.local import userns
    from hermes_sandboxes.backends.local.guest import syscalls as sc

    def mapped(idmap):
        made_r, made_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            sc.unshare(sc.CLONE_NEWUSER)
            os.write(made_w, b"u")
            os.read(done_r, 1)
            os._exit(0)
        os.read(made_r, 1)
        try:
            userns.write_maps(pid, idmap)
            with open(f"/proc/{pid}/uid_map") as u, open(f"/proc/{pid}/gid_map") as g:
                return {"uid_map": u.read().split(), "gid_map": g.read().split()}
        except OSError as exc:
            return {"error": str(exc)}
        finally:
            os.write(done_w, b"x")
            os.waitpid(pid, 0)

    good = userns.rootless_map()
    theirs = ((0, os.getuid(), 1), (1, 1, 1))  # host uid 1 is no block of this user's
    bad = userns.IdMap(theirs, good.gids)
    print(json.dumps({"full": good.full, "good": mapped(good), "bad": mapped(bad),
                      "uids": good.uids, "gids": good.gids}))
""")


@pytest.fixture(scope="module")
def maps(rootless_user: kit.TestUser) -> dict[str, Any]:
    out = rootless_user.run([str(rootless_user.python), "-c", SCRIPT], cwd=str(kit.REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_both_maps_are_written_with_the_users_block(maps: dict[str, Any]) -> None:
    assert maps["full"], "the test user has a subordinate block: newuidmap/newgidmap write its maps"
    assert maps["good"]["uid_map"] == [str(n) for line in maps["uids"] for n in line]
    assert maps["good"]["gid_map"] == [str(n) for line in maps["gids"] for n in line]


def test_a_map_outside_the_users_block_is_refused_in_the_tools_words(maps: dict[str, Any]) -> None:
    error = maps["bad"]["error"]
    assert error.startswith("newuidmap failed: "), error
    assert len(error) > len("newuidmap failed: ") and "\n" not in error
