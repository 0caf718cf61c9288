"""Diff summaries: short by-directory listings for big changes, a full listing on request."""

from __future__ import annotations

from hermes_sandboxes.recorder.diffsummary import DirStats, full_listing, stats, summarize
from hermes_sandboxes.sandbox import ChangeKind, FileChange

A, M, D = ChangeKind.ADDED, ChangeKind.MODIFIED, ChangeKind.DELETED


def added(path: str, size: int = 10) -> FileChange:
    return FileChange(path, A, size)


def rows(changes: list[FileChange], max_rows: int = 20) -> dict[str, DirStats]:
    summary = summarize(changes, max_rows=max_rows)
    assert len(summary.rows) <= max_rows
    assert sum(r.files for r in summary.rows) == summary.total.files == len(changes)
    return {r.path: r for r in summary.rows}


def test_counts_and_bytes_per_kind() -> None:
    total = stats("/", [
        FileChange("/a", A, 100),
        FileChange("/b", M, 30, old_size=50),
        FileChange("/c", D, None, old_size=7),
        FileChange("/d", A, None),  # size unknown counts as zero, not as an error
    ])
    assert (total.added, total.modified, total.deleted, total.files) == (2, 1, 1, 4)
    assert (total.added_bytes, total.modified_bytes, total.deleted_bytes) == (100, 30, 7)
    assert total.net_bytes == 100 + (30 - 50) - 7


def test_no_changes_make_no_rows() -> None:
    summary = summarize([])
    assert summary.rows == () and summary.total.files == 0
    assert summary.to_dict()["total"]["files"] == 0


def test_a_single_deep_directory_collapses_to_its_deepest_common_directory() -> None:
    changes = [added(f"/root/app/build/out/f{i}.o") for i in range(50)]
    assert list(rows(changes)) == ["/root/app/build/out"]


def test_a_big_subtree_is_broken_down_while_a_lone_change_stays_one_row() -> None:
    changes = [added(f"/root/app/node_modules/pkg{i % 5}/f{i}.js") for i in range(5000)]
    changes += [FileChange("/etc/hosts", M, 60, old_size=50)]
    changes += [added(f"/root/app/src/m{i}.py") for i in range(30)]
    listed = rows(changes)
    assert "/etc" in listed and listed["/etc"].modified == 1
    assert listed["/root/app/src"].added == 30
    assert all(f"/root/app/node_modules/pkg{i}" in listed for i in range(5))
    assert listed["/root/app/node_modules/pkg0"].added_bytes == 1000 * 10


def test_many_equal_subdirectories_stay_one_row_below_the_root() -> None:
    changes = [added(f"/root/app/node_modules/pkg{i}/index.js") for i in range(300)]
    changes += [added("/etc/motd")]
    listed = rows(changes)
    assert set(listed) == {"/etc", "/root/app/node_modules"}
    assert listed["/root/app/node_modules"].files == 300


def test_too_many_top_directories_list_the_biggest_and_keep_the_rest_under_the_root() -> None:
    changes = [added(f"/d{i:02}/f{j}") for i in range(30) for j in range(i + 1)]
    listed = rows(changes, max_rows=10)
    assert len(listed) == 10
    assert listed["/"].rest and listed["/"].files == sum(range(1, 22))  # d00..d20 stay in "/"
    assert all(f"/d{i:02}" in listed for i in range(21, 30))


def test_files_directly_in_a_split_directory_get_their_own_rest_row() -> None:
    changes = [added("/root/app/README"), *[added(f"/root/app/src/m{i}.py") for i in range(3)],
               *[added(f"/root/app/tests/t{i}.py") for i in range(2)]]
    listed = rows(changes)
    assert listed["/root/app"].rest and listed["/root/app"].files == 1
    assert listed["/root/app/src"].files == 3 and not listed["/root/app/src"].rest


def test_the_row_limit_is_kept_however_small() -> None:
    changes = [added(f"/a{i}/b{j}/c{k}") for i in range(4) for j in range(4) for k in range(4)]
    for max_rows in (1, 2, 3, 5, 8, 20):
        rows(changes, max_rows=max_rows)
    assert list(rows(changes, max_rows=1)) == ["/"]


def test_relative_and_odd_paths_are_grouped_like_absolute_ones() -> None:
    listed = rows([added("root/x/f"), added("/root//x/./g")])
    assert list(listed) == ["/root/x"] and listed["/root/x"].files == 2


def test_full_listing_is_every_change_sorted_by_path() -> None:
    changes = [added("/b/z"), FileChange("/a", D, None, 3), added("/b/a"), added("/a-b")]
    assert [c.path for c in full_listing(changes)] == ["/a", "/a-b", "/b/a", "/b/z"]
