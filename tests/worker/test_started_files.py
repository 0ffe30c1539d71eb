"""Reading which jobs the last run's children started (``shardworker.worker.started``): the
progress files are trusted only whole and from this boot, and what a start read is kept until
its recovery is over. Any doubt gives None: every orphan is charged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardworker.child.progress import ProgressFile
from shardworker.core import layout
from shardworker.worker import started


def left_by_a_run(directory: Path, ids_by_shard: dict[int, list[int]], slots: int = 4) -> None:
    """Progress files as a run's children leave them, with the boot file it wrote at its start."""
    directory.mkdir(mode=0o700, exist_ok=True)
    assert started.take_previous(str(directory), len(ids_by_shard)) is None  # no boot file yet: nothing trusted
    for shard, ids in ids_by_shard.items():
        progress = ProgressFile(layout.progress_path(str(directory), shard), slots).open()
        for slot, job_id in enumerate(ids):
            progress.begin(slot, job_id)
    started.recovered(str(directory))


def test_the_ids_in_every_slot_of_this_boot_are_read(tmp_path: Path) -> None:
    left_by_a_run(tmp_path, {0: [11, 12], 1: [13]})
    assert started.read_progress(str(tmp_path)) == {11, 12, 13}
    assert os.stat(layout.progress_path(str(tmp_path), 0)).st_mode & 0o777 == 0o600


def test_a_missing_boot_id_trusts_nothing(tmp_path: Path) -> None:
    left_by_a_run(tmp_path, {0: [11]})
    os.unlink(tmp_path / layout.PROGRESS_BOOT)
    assert started.read_progress(str(tmp_path)) is None


def test_a_missing_progress_file_trusts_nothing(tmp_path: Path) -> None:
    """A child's file missing (the run died before it made it, or it was deleted): its
    started jobs are unknown."""
    left_by_a_run(tmp_path, {0: [11], 1: [12]})
    os.unlink(layout.progress_path(str(tmp_path), 1))
    assert started.read_progress(str(tmp_path)) is None


def test_another_boot_trusts_nothing(tmp_path: Path) -> None:
    left_by_a_run(tmp_path, {0: [11]})
    (tmp_path / layout.PROGRESS_BOOT).write_text("another-boot\n")
    assert started.read_progress(str(tmp_path)) is None


@pytest.mark.parametrize("size", [0, 7, 8 * 3, 8 * 11])
def test_a_file_of_the_wrong_size_trusts_nothing(tmp_path: Path, size: int) -> None:
    left_by_a_run(tmp_path, {0: [11], 1: [12]})
    os.truncate(layout.progress_path(str(tmp_path), 1), size)
    assert started.read_progress(str(tmp_path)) is None


def test_a_start_keeps_what_it_read_until_its_recovery_is_over(tmp_path: Path) -> None:
    """A start that dies before its recovery leaves what it read to the next one, whose own
    children's ids add to it; the new children's files start empty."""
    left_by_a_run(tmp_path, {0: [11, 12]})
    assert started.take_previous(str(tmp_path), 1) == {11, 12}
    assert layout.progress_names(str(tmp_path)) == []
    ProgressFile(layout.progress_path(str(tmp_path), 0), 4).open().begin(0, 13)
    assert started.take_previous(str(tmp_path), 1) == {11, 12, 13}
    ProgressFile(layout.progress_path(str(tmp_path), 0), 4).open()
    started.recovered(str(tmp_path))
    assert started.take_previous(str(tmp_path), 1) == frozenset()


def test_a_start_that_trusted_nothing_is_remembered(tmp_path: Path) -> None:
    """A start that could trust nothing and died before its recovery: the next one trusts
    nothing either, though the files in between are of this boot."""
    left_by_a_run(tmp_path, {0: [11]})
    (tmp_path / layout.PROGRESS_BOOT).write_text("another-boot\n")
    assert started.take_previous(str(tmp_path), 1) is None
    ProgressFile(layout.progress_path(str(tmp_path), 0), 4).open()
    assert started.take_previous(str(tmp_path), 1) is None
    ProgressFile(layout.progress_path(str(tmp_path), 0), 4).open()
    (tmp_path / layout.STARTED_FILE).write_text("{not json")
    assert started.take_previous(str(tmp_path), 1) is None
