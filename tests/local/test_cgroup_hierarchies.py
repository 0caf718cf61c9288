"""Which cgroup hierarchies a host has, from its mount table: the v1 layout of this machine kind, a
v2-only host (what Debian 12, Ubuntu 22.04+ and Fedora boot with), and a container's view."""

from __future__ import annotations

from pathlib import Path

from hermes_sandboxes.backends.local.cgroups import hierarchies, probe

HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
42 31 0:37 / /mnt/again rw,relatime - cgroup cgroup rw,xattr,name=systemd
"""
HYBRID_OWN = """\
9:name=systemd:/user.slice/session-1.scope
6:freezer:/
4:memory:/process_api/abc
1:cpu,cpuacct:/
0::/user.slice/session-1.scope
"""


def test_a_hybrid_host_lists_each_hierarchy_once_with_our_group_in_it() -> None:
    found = hierarchies.parse(HYBRID_MOUNTS, HYBRID_OWN)
    assert [h.key for h in found] == ["cpu,cpuacct", "freezer", "memory", "name=systemd", "unified"]
    by_key = {h.key: h for h in found}
    assert by_key["memory"].own_dir() == Path("/sys/fs/cgroup/memory/process_api/abc")
    assert by_key["name=systemd"].mount == Path("/sys/fs/cgroup/systemd")  # the first mount of it
    assert by_key["unified"].version == 2 and by_key["cpu,cpuacct"].names == {"cpu", "cpuacct"}
    assert hierarchies.find(found, "cpu") is by_key["cpu,cpuacct"]
    assert probe(found).version == 1  # the v1 freezer is there


def test_a_v2_only_host_uses_the_unified_hierarchy() -> None:
    found = hierarchies.parse("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
                              "0::/user.slice/user-0.slice/session-3.scope\n")
    assert [(h.key, h.mount, h.own) for h in found] == [
        ("unified", Path("/sys/fs/cgroup"), "user.slice/user-0.slice/session-3.scope")]
    assert probe(found).version == 2


def test_a_container_view_is_relative_to_the_mounts_root() -> None:
    found = hierarchies.parse("50 40 0:31 /docker/c1 /sys/fs/cgroup/freezer ro - cgroup cgroup rw,freezer\n",
                              "6:freezer:/docker/c1/inner\n")
    assert found[0].own_dir() == Path("/sys/fs/cgroup/freezer/inner")


def test_no_cgroup_hierarchy_means_no_local_sandboxes() -> None:
    result = probe([])
    assert result.version is None and result.fatal
