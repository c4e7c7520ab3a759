"""The one file writer (synth/output_files.py): regular files replaced atomically with the mode
the umask gives (or the old file's mode and owner), everything else written through, a failed
write leaving the old file and no temporary behind."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

from synth.errors import UsageError
from synth.output_files import write_text, writing


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path, umask_022):
    path = write_text(tmp_path / "out.toml", "x = 1\n")
    assert path.read_text() == "x = 1\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.toml"]


def test_an_existing_file_keeps_its_mode(tmp_path, umask_022):
    path = tmp_path / "out.toml"
    path.write_text("old\n")
    path.chmod(0o600)
    write_text(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_link_to_a_file_stays_a_link(tmp_path):
    target = tmp_path / "real.toml"
    target.write_text("old\n")
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def test_a_device_or_a_link_to_one_is_written_through(tmp_path):
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    write_text(link, "discarded\n")
    write_text("/dev/null", "discarded\n")
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo).read()))
    reader.start()
    write_text(fifo, "through the pipe\n")
    reader.join(10)
    assert received == ["through the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.csv"
    path.write_text("old complete content\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UsageError, match=r"-o out.csv: cannot write it \(No space left on device\)"):
        write_text(path, "new content that does not fit\n" * 1000, "-o out.csv")
    assert path.read_text() == "old complete content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_a_failing_write_inside_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with writing(path) as handle:
            handle.write("half")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and len(list(tmp_path.iterdir())) == 1


def test_a_directory_or_a_missing_directory_is_one_error(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        write_text(tmp_path, "x")
    with pytest.raises(UsageError, match="no directory"):
        write_text(tmp_path / "missing" / "out.toml", "x")


def test_hard_links_all_see_the_new_text(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text("old\n")
    os.link(path, tmp_path / "b.toml")
    write_text(path, "new\n")
    assert (tmp_path / "b.toml").read_text() == "new\n"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_keeps_its_owner(tmp_path):
    path = tmp_path / "theirs.toml"
    path.write_text("old\n")
    os.chown(path, 12345, 12345)
    path.chmod(0o640)
    write_text(path, "new\n")
    info = path.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (12345, 12345, 0o640)
    assert path.read_text() == "new\n"


def test_a_name_of_the_longest_length_gets_a_temporary_that_fits(tmp_path):
    path = tmp_path / ("\u00e9" * 125 + ".toml")  # 255 bytes, the most a name may have
    write_text(path, "x = 1\n")
    assert path.read_text() == "x = 1\n" and len(list(tmp_path.iterdir())) == 1
