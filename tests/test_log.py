"""The Parquet event log: atomic publishing, one writer, consistent readers, compaction."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT

from ingest.errors import LogError, PartDamagedError, SeqConflictError, WriterLockedError
from ingest.events import RunResumed, RunStarted, SnapshotSeen, ToolCalled
from ingest.log import RECORD, EventLog, LogWriter, RecordDamagedError
from ingest.schema import SCHEMA, from_row


def _created(data_dir: Path) -> LogWriter:
    writer = LogWriter.create(data_dir, "r")
    writer.append([RunStarted(command="t")], expected_seq=0)
    return writer


def facts(n: int, start: int = 0) -> list[SnapshotSeen]:
    return [SnapshotSeen(task="t", snapshot=f"s{start + i}", path="/p", global_index=start + i) for i in range(n)]


def child(script: str, data_dir: Path) -> subprocess.Popen:
    code = textwrap.dedent(script)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", code, str(data_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.01)


def test_append_assigns_gapless_seqs_and_reads_back(data_dir):
    with _created(data_dir) as w:
        w.append(facts(3))
        table = w.append(facts(2, 3))
        assert table.column("seq").to_pylist() == [5, 6]
        assert w.tail == 6
    log = EventLog(data_dir, "r")
    rows = log.read_table().to_pylist()
    assert [r["seq"] for r in rows] == list(range(1, 7))
    assert from_row(rows[3]) == facts(3)[2]
    assert rows[0]["kind"] == "run_started"


def test_append_refuses_a_stale_expected_seq(data_dir):
    with _created(data_dir) as w:
        w.append(facts(1), expected_seq=1)
        with pytest.raises(SeqConflictError, match="expected tail seq 1, log is at 2"):
            w.append(facts(1), expected_seq=1)
    assert EventLog(data_dir, "r").tail_seq() == 2


def test_an_existing_run_cannot_be_created_again(data_dir):
    _created(data_dir).close()
    with pytest.raises(LogError, match="already exists"):
        LogWriter.create(data_dir, "r")


def test_second_writer_in_another_process_is_refused(data_dir):
    _created(data_dir).close()
    ready = data_dir / "ready"
    holder = child(
        f"""
        import sys, time, pathlib
        from ingest.log import LogWriter
        w = LogWriter.open(sys.argv[1], "r")
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(60)
        """,
        data_dir,
    )
    try:
        wait_for(ready)
        with pytest.raises(WriterLockedError, match=rf"pid {holder.pid}"):
            LogWriter.open(data_dir, "r")
    finally:
        holder.kill()
        holder.wait()
    # The lock dies with its process: the run can be written again.
    with LogWriter.open(data_dir, "r") as w:
        w.append([RunResumed()])
    assert EventLog(data_dir, "r").tail_seq() == 2


def _killed_at(data_dir: Path, point: str) -> None:
    """A writer appends 1 event, then 5000, and is killed at ``point`` of the second append."""
    _created(data_dir).close()
    script = textwrap.dedent("""
        import sys
        from ingest.log import LogWriter
        from ingest.events import SnapshotSeen
        w = LogWriter.open(sys.argv[1], "r")
        w.append([SnapshotSeen(task="t", snapshot="a", path="/p")])
        w.append([SnapshotSeen(task="t", snapshot=str(i), path="/p") for i in range(5000)])
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEACHER_MCTS_CRASH_AT=f"{point}:2")
    done = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_kill_before_the_record_commits_a_part_leaves_no_part(data_dir):
    _killed_at(data_dir, "publish.written")
    log_dir = EventLog(data_dir, "r").log_dir
    assert any(n.startswith(".tmp-part-") for n in os.listdir(log_dir))  # the uncommitted write
    log = EventLog(data_dir, "r")
    assert log.tail_seq() == 2
    assert log.read_table().column("seq").to_pylist() == [1, 2]
    with LogWriter.open(data_dir, "r") as w:  # recovery removes the temp file
        w.append(facts(1))
    assert not any(n.startswith(".tmp-") for n in os.listdir(log_dir))
    assert EventLog(data_dir, "r").read_table().column("seq").to_pylist() == [1, 2, 3]


def test_a_part_committed_but_not_renamed_is_read_and_the_writer_renames_it(data_dir):
    _killed_at(data_dir, "publish.recorded")
    log = EventLog(data_dir, "r")
    assert [p.path.name.startswith(".tmp-part-") for p in log.parts()] == [False, False, True]
    assert log.read_table(["seq"]).column("seq").to_pylist() == list(range(1, 5003))
    with LogWriter.open(data_dir, "r") as w:
        w.append(facts(1))
    assert not any(n.startswith(".tmp-") for n in os.listdir(log.log_dir))
    assert log.read_table(["seq"]).column("seq").to_pylist() == list(range(1, 5004))


@pytest.mark.slow
def test_random_kills_never_corrupt_the_log(data_dir):
    """Each kill lands while the writer appends: once its log grew by a random number of
    appends (a condition, whatever the machine's speed), after a random short delay."""
    import random

    _created(data_dir).close()
    rng = random.Random()
    for _trial in range(4):
        start = EventLog(data_dir, "r").tail_seq()
        writer = child(
            """
            import sys
            from ingest.log import LogWriter
            from ingest.events import SnapshotSeen
            w = LogWriter.open(sys.argv[1], "r")
            for k in range(100000):
                w.append([SnapshotSeen(task="t", snapshot=str(i), path="/p" * 50)
                          for i in range(200)])
            """,
            data_dir,
        )
        grown = start + 200 * rng.randint(1, 40)
        deadline = time.monotonic() + 300
        while EventLog(data_dir, "r").tail_seq() < grown and writer.poll() is None:
            assert time.monotonic() < deadline, "the writer did not append"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.02))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        assert writer.returncode == -signal.SIGKILL, writer.stderr.read()
        seqs = EventLog(data_dir, "r").read_table(["seq"]).column("seq").to_pylist()
        assert seqs == list(range(1, len(seqs) + 1))
        for part in EventLog(data_dir, "r").parts():
            assert pq.read_metadata(part.path).num_rows == part.rows


@pytest.mark.slow
def test_readers_see_a_consistent_prefix_while_a_writer_appends(data_dir):
    _created(data_dir).close()
    writer = child(
        """
        import sys
        from ingest.log import LogWriter
        from ingest.events import SnapshotSeen
        w = LogWriter.open(sys.argv[1], "r")
        for k in range(600):
            w.append([SnapshotSeen(task="t", snapshot=str(k), path="/p")] * (1 + k % 3))
        """,
        data_dir,
    )
    log = EventLog(data_dir, "r")
    last, reads, ended = 0, 0, False
    while not ended or reads < 3:  # the last read begins after the writer has ended
        ended = writer.poll() is not None
        seqs = log.read_table(["seq"]).column("seq").to_pylist()
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(seqs) >= last
        last = len(seqs)
        reads += 1
    assert writer.returncode == 0, writer.stderr.read()
    assert last == 1 + sum(1 + k % 3 for k in range(600))
    assert reads > 3


@pytest.mark.slow
def test_compaction_bounds_files_and_keeps_content(data_dir):
    with _created(data_dir) as w:
        for k in range(700):
            w.append(facts(1 + k % 4, start=k * 10))
        files = len(os.listdir(EventLog(data_dir, "r").log_dir)) - 1  # and the record
        assert w.file_count() == files
    # 701 appends in base 8 = 1275 (octal): at most 1+2+7+5 = 15 parts.
    assert files <= 15
    table = EventLog(data_dir, "r").read_table()
    expected = [RunStarted(command="t")]
    for k in range(700):
        expected += facts(1 + k % 4, start=k * 10)
    assert table.column("seq").to_pylist() == list(range(1, len(expected) + 1))
    assert [from_row(r) for r in table.to_pylist()] == expected
    assert table.schema.names == SCHEMA.names


def test_a_merged_part_gives_each_large_kind_a_row_group_and_a_kind_load_skips_the_rest(data_dir):
    """Kinds with >= 1/8 of a merged part's rows get a row group each, the others share one."""
    import duckdb

    def calls(n: int, start: int) -> list[ToolCalled]:
        return [
            ToolCalled(tree_id="T1", edge_id="e", turn=1, step=1, call_id=f"c{start + i}", tool="read", status="ok")
            for i in range(n)
        ]

    with _created(data_dir) as w:  # 8 flushes, merged: 1 start, 56 calls, 3 snapshots
        for k in range(7):
            w.append(calls(8, 8 * k) + facts(1 if k < 3 else 0, start=k))
    part = EventLog(data_dir, "r").parts()[0]
    assert part.level == 1
    meta = pq.ParquetFile(part.path)
    groups = [meta.read_row_group(g, columns=["seq", "kind"]) for g in range(meta.num_row_groups)]
    kinds = [sorted(set(g.column("kind").to_pylist())) for g in groups]
    assert kinds == [["tool_called"], ["run_started", "snapshot_seen"]]
    for g in groups:
        seqs = g.column("seq").to_pylist()
        assert seqs == sorted(seqs)
    # The statistics let a scan of one kind skip the other row group.
    con = duckdb.connect()
    plan = con.execute(
        "explain analyze select count(*) from read_parquet(?) where kind = 'snapshot_seen'",
        [str(part.path)],
    ).fetchall()[0][1]
    assert re.search(r"Row Groups Scanned: 1 / 2", plan), plan
    table = EventLog(data_dir, "r").read_table()
    assert table.column("seq").to_pylist() == list(range(1, 61))
    assert table.column("kind").to_pylist().count("tool_called") == 56


def test_a_merge_of_parts_grouped_by_kind_writes_each_group_in_seq_order(tmp_path):
    """A merge beyond the writer's cache reads merged parts as written (grouped by kind)."""
    from ingest.log import write_part
    from ingest.schema import to_arrow

    events = [RunStarted(command="t")] + [
        e
        for k in range(20)
        for e in (
            *facts(1, start=k),
            ToolCalled(tree_id="T1", edge_id="e", turn=1, step=1, call_id=f"c{k}", tool="read", status="ok"),
        )
    ]
    table = to_arrow(events, "r", 1, datetime.now(UTC))
    grouped = table.sort_by([("kind", "descending"), ("seq", "descending")])  # any order
    write_part(grouped, str(tmp_path / "p.parquet"), level=1)
    meta = pq.ParquetFile(tmp_path / "p.parquet")
    groups = [meta.read_row_group(g, columns=["seq", "kind"]) for g in range(meta.num_row_groups)]
    assert [sorted(set(g.column("kind").to_pylist())) for g in groups] == [
        ["snapshot_seen"],
        ["tool_called"],
        ["run_started"],
    ]
    for g in groups:
        seqs = g.column("seq").to_pylist()
        assert seqs == sorted(seqs)


def _legacy(data_dir: Path, appends: int = 6) -> EventLog:
    """A run as written before records: its parts, no record (its first part and ``appends`` more)."""
    with _created(data_dir) as w:
        for k in range(appends):
            w.append(facts(1, start=k))
    log = EventLog(data_dir, "r")
    (log.log_dir / RECORD).unlink()
    return log


def test_a_run_before_records_prefers_the_merged_part_when_a_crash_left_both_and_is_adopted(data_dir):
    log = _legacy(data_dir)
    parts = log.parts()
    # Simulate a crash after publishing a merge of parts 3..7 but before deleting them.
    tables = [pq.read_table(p.path) for p in parts[2:]]
    pq.write_table(pa.concat_tables(tables), log.log_dir / "part-000000000003-000000000007-L1.parquet")
    assert [p.path.name for p in log.parts()][-1] == "part-000000000003-000000000007-L1.parquet"
    assert log.read_table(["seq"]).column("seq").to_pylist() == list(range(1, 8))
    with LogWriter.open(data_dir, "r") as w:  # adoption deletes the superseded parts, records the rest
        assert w.file_count() == 3
    assert len(os.listdir(log.log_dir)) == 4
    record = log.record()
    assert record is not None and [p.name for p in record.parts()] == [p.path.name for p in log.parts()]
    assert log.read_table(["seq"]).column("seq").to_pylist() == list(range(1, 8))


def test_a_run_before_records_whose_overlapping_parts_disagree_is_refused(data_dir):
    """A part overlapping others with other events: one of them is not this run's; nothing is read or deleted."""
    log = _legacy(data_dir)
    tables = [pq.read_table(p.path) for p in log.parts()[2:]]
    forged = pa.concat_tables(tables)
    forged = forged.set_column(
        forged.column_names.index("snapshot"), "snapshot", pa.array(["forged"] * forged.num_rows)
    )
    pq.write_table(forged, log.log_dir / "part-000000000003-000000000007-L1.parquet")
    before = {n: (log.log_dir / n).read_bytes() for n in os.listdir(log.log_dir)}
    with pytest.raises(LogError, match="hold seqs 3..3 with different events: one of them is not this run.s"):
        log.read_table()
    with pytest.raises(LogError, match="with different events"):
        LogWriter.open(data_dir, "r")
    assert {n: (log.log_dir / n).read_bytes() for n in os.listdir(log.log_dir)} == before


def test_a_run_is_its_recorded_parts_not_the_files_in_its_directory(data_dir):
    """A part copied in (a wider range, the same events but one) is never read; the writer refuses it."""
    with _created(data_dir) as w:
        for k in range(3):
            w.append(facts(1, start=k))
    log = EventLog(data_dir, "r")
    table = log.read_table()
    table = table.set_column(table.column_names.index("snapshot"), "snapshot", pa.array(["x"] * table.num_rows))
    from ingest.log import encode_part, part_name

    data, digest = encode_part(table, 1)
    forged = log.log_dir / part_name(1, table.num_rows, 1, digest)
    forged.write_bytes(data.to_pybytes())
    assert log.read_table(["snapshot"]).column("snapshot").to_pylist()[1:] == ["s0", "s1", "s2"]
    with pytest.raises(LogError, match=re.escape(f"{forged}: not a part the run's record names")):
        LogWriter.open(data_dir, "r")
    assert forged.exists()


def test_a_record_line_changed_is_damage_and_a_line_cut_short_was_never_committed(data_dir):
    with _created(data_dir) as w:
        w.append(facts(2))
    log = EventLog(data_dir, "r")
    path = log.log_dir / RECORD
    good = path.read_bytes()
    path.write_bytes(good + b'{"entry": 3, "add"')  # a crash while appending an entry
    assert log.tail_seq() == 3
    with LogWriter.open(data_dir, "r") as w:
        w.append(facts(1))
    assert path.read_bytes().startswith(good) and path.read_bytes().count(b"\n") == 3
    assert log.tail_seq() == 4
    changed = path.read_bytes().replace(b'"entry":2', b'"entry":5', 1)
    path.write_bytes(changed)
    with pytest.raises(RecordDamagedError, match="line 2 is damaged"):
        log.parts()
    with pytest.raises(RecordDamagedError, match="does not verify, nothing was appended"):
        LogWriter.open(data_dir, "r")


def test_a_part_of_another_run_is_damage(data_dir):
    """Its events name another run: every reader's footer check and verify's check of every event say so."""
    from ingest.integrity import verify_log

    with _created(data_dir) as w:
        w.append(facts(2))
    other = LogWriter.create(data_dir, "other")
    other.append([RunStarted(command="t")] + facts(2))
    other.close()
    log = EventLog(data_dir, "r")
    (log.log_dir / RECORD).unlink()  # a run before records: its part files are its log
    mine, theirs = log.parts()[1], EventLog(data_dir, "other").parts()[0]
    mine.path.unlink()
    copied = log.log_dir / theirs.path.name  # seqs 1..3 with a correct checksum: the widest cover
    copied.write_bytes(theirs.path.read_bytes())
    with pytest.raises(
        LogError, match=re.escape(f"{copied}: not a part of this log (it holds events of run 'other', not of 'r')")
    ):
        log.read_table()
    found = verify_log(log)
    assert not found.ok and found.first_bad.name == copied.name and "events of run 'other'" in found.problem


@pytest.mark.parametrize("damage", ["footer", "page"])
def test_compaction_names_a_part_damaged_while_the_writer_is_open(data_dir, damage):
    """A writer checks every part when it opens; one damaged later is caught by the merge reading it."""
    with _created(data_dir) as w:
        for k in range(6):
            w.append(facts(1, start=k))
    log = EventLog(data_dir, "r")
    with LogWriter.open(data_dir, "r") as w:  # the parts check; this writer has none in its cache
        damaged = log.parts()[3].path
        raw = bytearray(damaged.read_bytes())
        if damage == "footer":
            raw[-4:] = b"XXXX"  # the footer magic
        else:
            raw[len(raw) // 2] ^= 0xFF  # one byte of a page no footer check reads
        damaged.write_bytes(bytes(raw))
        before = sorted(os.listdir(log.log_dir))
        with pytest.raises(PartDamagedError, match=re.escape(f"{damaged}: damaged (its content does not match")):
            w.append(facts(1, start=6))  # the eighth part: merging reads the other seven
    assert set(before) <= set(os.listdir(log.log_dir))  # nothing merged away
    with pytest.raises(PartDamagedError, match="run 'r' does not verify, nothing was appended"):
        LogWriter.open(data_dir, "r")


def test_a_gap_in_the_log_is_reported(data_dir):
    with _created(data_dir) as w:
        w.append(facts(2))
        w.append(facts(2))
    log = EventLog(data_dir, "r")
    missing = log.parts()[1]
    missing.path.unlink()
    with pytest.raises(
        LogError, match=re.escape(f"{missing.path.name} (seqs 2..3) is named by the run's record but is not in")
    ):
        log.parts()
    (log.log_dir / RECORD).unlink()  # a run written before records: its files are its log
    with pytest.raises(LogError, match=r"seqs 2-3 are missing: no part holds them \(the log goes on to seq 5\)"):
        log.parts()


def test_an_edge_id_must_follow_from_its_parent_slot_and_attempt():
    from pydantic import ValidationError

    from ingest.events import EdgeStarted

    ok = EdgeStarted(tree_id="T1", edge_id="T1.2/e3-2", parent_id="T1.2", slot=3, attempt=2)
    assert from_row({"kind": "edge_started", **ok.model_dump()}) == ok
    with pytest.raises(ValidationError, match="must be 'T1/e1-2'"):
        EdgeStarted(tree_id="T1", edge_id="T1/e1-1", parent_id="T1", slot=1, attempt=2)
