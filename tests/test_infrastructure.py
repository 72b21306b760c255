"""The one definition of each infrastructure rule: atomic write, same-file signature, retry while a log moves."""

from __future__ import annotations

import os
import re
import stat

import pytest

from ingest.errors import LogError, OutputError
from ingest.listing import MOVES, Moved, while_moving
from ingest.paths import TMP_MARK, file_signature, write_atomically


def test_an_atomic_write_leaves_the_old_file_or_the_whole_new_one(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def fails(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"f\.txt: cannot write the note \(No space left on device\)"):
        write_atomically(path, fails, "the note")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]  # no temporary file left
    assert write_atomically(path, "new") == path and path.read_text() == "new"


def test_a_kept_file_wins_and_is_made_owner_only(tmp_path):
    key = tmp_path / "key"
    write_atomically(key, b"first", mode=0o600, keep=True)
    write_atomically(key, b"second", mode=0o600, keep=True)
    assert key.read_bytes() == b"first" and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["key"]


def test_a_file_named_by_what_was_written(tmp_path):
    def name(tmp):
        assert tmp.name.startswith(f"{TMP_MARK}{os.getpid()}-")  # (the sweeps tell a dead writer's by its pid)
        return tmp_path / f"{tmp.read_text()}.txt"

    assert write_atomically(tmp_path / "x", "abc", name=name, durable=False) == tmp_path / "abc.txt"


def test_the_signature_changes_when_another_file_takes_the_name(tmp_path):
    path = tmp_path / "record"
    path.write_text("same")
    before = file_signature(path)
    other = tmp_path / "other"
    other.write_text("same")
    os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    os.replace(other, path)  # same size and mtime: only the inode (and ctime) tell
    assert file_signature(path) != before
    assert file_signature(path, portable=True) == before[:2]


def test_a_read_is_tried_again_while_the_log_moves_then_names_the_directory(tmp_path):
    tries = []

    def read():
        tries.append(1)
        if len(tries) < 3:
            raise FileNotFoundError(2, "gone", str(tmp_path / "part-1.parquet"))
        return "read"

    assert while_moving(tmp_path, read, "try again") == "read" and len(tries) == 3

    def never():
        tries.append(1)
        raise Moved("part-2.parquet is named by the record but is not there")

    tries.clear()
    with pytest.raises(LogError, match=rf"^{re.escape(str(tmp_path))}: part-2\.parquet is named .* - try again$"):
        while_moving(tmp_path, never, "try again")
    assert len(tries) == MOVES
