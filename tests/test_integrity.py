"""Integrity of the log: checksums every reader checks, verify, the writer's refusal, quarantine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_run, rename_in_record
from soundness import assert_log_is_sound, tree_shape

from cli import cli
from engine.catalog import Catalog
from ingest.errors import PartDamagedError, WriterLockedError
from ingest.events import RunResumed
from ingest.integrity import quarantine, verify_log
from ingest.log import EventLog, LogWriter, content_digest, encode_part, part_name, run_dir

CHECKSUM = "its content does not match the checksum its name records"


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


@pytest.fixture
def run(runs, tmp_path) -> Path:
    """A copy of the session's rounds-mode sim run (4 roots, finished) to damage."""
    data = tmp_path / "data"
    copy_run(runs, "rounds", data)
    return data


def middle_part(data: Path, run_id: str = "rounds") -> Path:
    parts = EventLog(data, run_id).parts()
    return parts[len(parts) // 2].path


def zero_bytes(path: Path, at: int, count: int = 200) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + count] = bytes(count)
    path.write_bytes(bytes(raw))


def legacy_name(path: Path) -> Path:
    """The name a part had before checksums (in a run before records: its record is removed)."""
    (path.parent / "_record.jsonl").unlink(missing_ok=True)
    return path.with_name(re.sub(r"-[0-9a-f]{32}\.parquet$", ".parquet", path.name))


def listing(data: Path, run_id: str = "rounds") -> dict[str, bytes]:
    directory = run_dir(data, run_id)
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_damaged_data_page_is_found_by_every_reader(run):
    """The issue's case: 200 zeroed bytes in the middle of a part. Views read none of them
    (a column no view reads), so replay printed `0 differ`, exit 0; pyarrow reading the
    file says `ZSTD decompression failed`."""
    part = middle_part(run)
    zero_bytes(part, part.stat().st_size // 2)
    with pytest.raises(OSError, match="ZSTD decompression failed|Corrupt|corrupt"):
        pq.read_table(part)
    before = listing(run)
    for command in (
        ["replay", "rounds"],
        ["paths", "rounds"],
        ["sql", "rounds", "select count(*) from trees"],
        ["audit", "rounds"],
        ["reselect", "rounds", "--top-k", "2"],
        ["explore", "--resume", "rounds"],
    ):
        r = invoke(run, *command)
        assert r.exit_code == 1 and "Traceback" not in r.output, (command, r.output)
        assert r.stderr.startswith("Error: ") and f"{part}: damaged ({CHECKSUM}); it holds seqs" in r.stderr, r.output
        assert f"'python cli.py --data {run} quarantine rounds {part.name}'" in r.stderr  # a hint that runs as printed
    assert listing(run) == before  # nothing appended, nothing removed
    with pytest.raises(PartDamagedError, match=re.escape(str(part))):
        EventLog(run, "rounds").read_table(["seq"])
    with pytest.raises(PartDamagedError, match=re.escape(str(part))):
        Catalog.for_log(EventLog(run, "rounds"))


@pytest.mark.parametrize("where", [0.1, 0.3, 0.5, 0.7, 0.9, 0.999])
def test_one_changed_byte_anywhere_is_found(run, where):
    """A bit flip anywhere in a part - a page, a column no view reads, the footer."""
    part = middle_part(run)
    raw = bytearray(part.read_bytes())
    raw[int(len(raw) * where)] ^= 0x01
    part.write_bytes(bytes(raw))
    with pytest.raises(PartDamagedError, match=re.escape(f"{part}: damaged ({CHECKSUM})")):
        Catalog.for_log(EventLog(run, "rounds"))
    with pytest.raises(PartDamagedError, match=re.escape(str(part))):
        EventLog(run, "rounds").read_table()
    found = verify_log(EventLog(run, "rounds"))
    assert not found.ok and found.first_bad.path == part and found.first_bad.problem == CHECKSUM


def test_a_part_rewritten_with_altered_values_is_found(run):
    """Valid Parquet, the same seqs and row count (footers agree): only the checksum tells."""
    part = middle_part(run)
    table = pq.read_table(part)
    kind = table.column_names.index("kind")
    altered = table.set_column(kind, "kind", pa.array(["run_finished"] * table.num_rows))
    pq.write_table(altered, part)
    r = invoke(run, "replay", "rounds")
    assert r.exit_code == 1 and f"{part}: damaged ({CHECKSUM})" in r.stderr, r.output


def test_verify_reports_the_first_damaged_part_its_seqs_and_the_intact_prefix(run):
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 0, r.output
    tail = EventLog(run, "rounds").tail_seq()
    assert r.stdout.rstrip().endswith(
        f"{tail} events: every checksum matches, every page decodes, every seq is there once"
    )
    parts = EventLog(run, "rounds").parts()
    first, second = parts[1].path, parts[-1].path
    zero_bytes(first, first.stat().st_size // 2)
    zero_bytes(second, 8)
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 1 and "Traceback" not in r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"run rounds: {len(parts)} parts, seqs 1..{tail}"
    damaged = [line.split()[1] for line in lines if line.startswith("DAMAGED")]
    assert damaged == [first.name, second.name]
    assert (
        f"verify: the log is intact up to seq {parts[1].first - 1} of {tail}; {first.name} "
        f"(seqs {parts[1].first}..{parts[1].last}) is damaged: {CHECKSUM}"
    ) in r.stdout
    assert f"first bad part: {first} (seqs {parts[1].first}..{parts[1].last})" in r.stdout
    assert f"python cli.py --data {run} quarantine rounds {first.name}" in r.stdout
    out = json.loads(invoke(run, "verify", "rounds", "--json").stdout)
    assert out["ok"] is False and out["intact_to"] == parts[1].first - 1 and out["first_bad"] == first.name
    assert out["first_bad_path"] == str(first)
    assert [p["part"] for p in out["parts"] if p["problem"]] == [first.name, second.name]


def test_verify_finds_a_part_written_wrong_whose_footer_and_checksum_agree(run):
    """A duplicated seq in a part of the right row count and seq range (as a writer bug
    would write it): readers' footer checks pass, reading every seq does not."""
    part = EventLog(run, "rounds").parts()[0]
    table = pq.read_table(part.path).sort_by("seq")
    seqs = table.column("seq").to_pylist()
    seqs[1] = seqs[2]  # seq 2 missing, seq 3 twice
    bad = table.set_column(table.column_names.index("seq"), "seq", pa.array(seqs, pa.int64()))
    data, digest = encode_part(bad, part.level)
    part.path.unlink()
    wrong = part_name(part.first, part.last, part.level, digest)
    (part.path.parent / wrong).write_bytes(data.to_pybytes())
    rename_in_record(run, "rounds", {part.path.name: wrong})
    Catalog.for_log(EventLog(run, "rounds"))  # the footer agrees: readers take it
    r = invoke(run, "verify", "rounds", "--json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["parts"][0]["problem"] == f"its seqs are not 1..{part.last} each once (seq 2 is 3)"
    assert out["intact_to"] == 0


@pytest.mark.slow  # resumes an exploration
def test_quarantine_moves_the_damage_aside_and_resume_grows_the_same_trees(runs, run):
    part = middle_part(run)
    zero_bytes(part, part.stat().st_size // 2)
    parts = EventLog(run, "rounds").parts()
    index = [p.path for p in parts].index(part)
    before = listing(run)
    intact = parts[index].first - 1
    for wrong in (parts[0].path.name, parts[-1].path.name):  # an intact part, a later one
        r = invoke(run, "quarantine", "rounds", wrong)
        assert r.exit_code == 1 and f"quarantine starts at the first bad part, {part.name}" in r.stderr, r.output
        assert "nothing was moved" in r.stderr
    assert listing(run) == before
    r = invoke(run, "quarantine", "rounds", str(part))  # a path works as well as a name
    assert r.exit_code == 0, r.output
    moved = [p.path.name for p in parts[index:]]
    assert r.stdout.splitlines()[0] == f"run rounds: moved {len(moved)} part(s) to {run_dir(run, 'rounds')}/quarantine:"
    assert f"the log now holds seqs 1..{intact}, intact ({parts[-1].last - intact} events moved: " in r.stdout
    assert "and the run's RunFinished)" in r.stdout
    assert f"python cli.py --data {run} explore --resume rounds" in r.stdout
    after = listing(run)  # never deleted: every byte is still there, moved; the record only grew
    record = "log/_record.jsonl"
    assert after[record].startswith(before.pop(record)) and b'"note":"quarantined"' in after.pop(record)
    assert sorted(after.values()) == sorted(before.values())
    assert sorted(n for n in after if n.startswith("quarantine/")) == sorted(f"quarantine/{n}" for n in moved)
    log = EventLog(run, "rounds")
    assert log.tail_seq() == intact and verify_log(log).ok
    r = invoke(run, "replay", "rounds")  # the intact prefix reads as any log does
    assert r.exit_code == 0 and "0 differ" in r.stdout, r.output
    r = invoke(run, "explore", "--resume", "rounds")
    assert r.exit_code == 0, r.output
    assert_log_is_sound(run, "rounds")
    assert invoke(run, "replay", "rounds").exit_code == 0
    assert tree_shape(run, "rounds") == tree_shape(runs, "rounds")  # rounds mode: the same trees again


def test_quarantine_of_the_first_part_leaves_an_empty_run(run):
    first = EventLog(run, "rounds").parts()[0].path
    zero_bytes(first, 100)
    r = invoke(run, "quarantine", "rounds", first.name)
    assert r.exit_code == 0, r.output
    assert "the log holds no event now (its first part was damaged): nothing can be resumed" in r.stdout
    assert not EventLog(run, "rounds").exists()
    r = invoke(run, "replay", "rounds")
    assert r.exit_code == 1 and "run 'rounds' not found" in r.stderr


def test_quarantine_of_a_log_that_verifies_or_is_being_written_is_refused(run):
    part = middle_part(run).name
    r = invoke(run, "quarantine", "rounds", part)
    assert r.exit_code == 1 and r.stderr == "Error: run 'rounds': the log verifies - nothing to quarantine\n"
    zero_bytes(middle_part(run), 100)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom ingest.log import WriterLock, EventLog\n"
            "lock = WriterLock(EventLog(sys.argv[1], 'rounds')); lock.acquire(); print('held', flush=True)\n"
            "time.sleep(600)",
            str(run),
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        r = invoke(run, "quarantine", "rounds", part)
        assert r.exit_code == 1 and f"is being written by another process (pid {holder.pid})" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert invoke(run, "quarantine", "rounds", part).exit_code == 0


def test_a_recorded_part_missing_is_reported_and_it_and_the_parts_after_it_can_be_quarantined(run):
    parts = EventLog(run, "rounds").parts()
    parts[1].path.unlink()
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 1
    assert (
        f"intact up to seq {parts[0].last} of {parts[-1].last}; {parts[1].path.name} "
        f"(seqs {parts[1].first}..{parts[1].last}) is damaged: named by the run's record, but missing"
    ) in r.stdout
    assert f"quarantine rounds {parts[1].path.name}" in r.stdout
    r = invoke(run, "explore", "--resume", "rounds")
    assert r.exit_code == 1 and "nothing was appended" in r.stderr
    assert invoke(run, "quarantine", "rounds", parts[1].path.name).exit_code == 0
    assert EventLog(run, "rounds").tail_seq() == parts[0].last and verify_log(EventLog(run, "rounds")).ok


def test_a_gap_in_a_run_before_records_is_reported_and_the_parts_after_it_can_be_quarantined(run):
    (run_dir(run, "rounds") / "log" / "_record.jsonl").unlink()
    parts = EventLog(run, "rounds").parts()
    parts[1].path.unlink()
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 1
    assert (
        f"intact up to seq {parts[0].last} of {parts[-1].last}; seqs {parts[1].first}-{parts[1].last} are missing"
    ) in r.stdout
    assert f"quarantine rounds {parts[2].path.name}" in r.stdout
    r = invoke(run, "explore", "--resume", "rounds")
    assert r.exit_code == 1 and "the log is inconsistent; nothing was appended" in r.stderr
    assert invoke(run, "quarantine", "rounds", parts[2].path.name).exit_code == 0
    assert EventLog(run, "rounds").tail_seq() == parts[0].last and verify_log(EventLog(run, "rounds")).ok


def test_quarantine_moves_the_spool_of_turns_that_followed_the_old_tail(run):
    spool = run_dir(run, "rounds") / "spool"
    spool.mkdir()
    (spool / "T001~e1-1--t1.arrow").write_bytes(b"a finished turn")
    part = middle_part(run)
    zero_bytes(part, 100)
    r = invoke(run, "quarantine", "rounds", part.name, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["spool_moved"] == str(run_dir(run, "rounds") / "quarantine" / "spool")
    assert not spool.exists() and Path(out["spool_moved"], "T001~e1-1--t1.arrow").read_bytes() == b"a finished turn"
    assert out["turns_moved"] > 0 and out["finished_moved"] is True


def test_parts_written_before_checksums_are_read_and_the_writer_gives_them_one(run):
    log = EventLog(run, "rounds")
    for p in log.parts():
        p.path.rename(legacy_name(p.path))
    tail = log.tail_seq()
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 0 and f"{len(log.parts())} part(s) carry no checksum" in r.stdout, r.output
    assert invoke(run, "replay", "rounds").exit_code == 0
    with LogWriter.open(run, "rounds") as writer:
        writer.append([RunResumed(note="t")])
    parts = log.parts()
    assert all(p.digest for p in parts) and parts[-2].last == tail
    for p in parts:
        assert p.digest == content_digest(p.path.read_bytes())
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 0 and "carry no checksum" not in r.stdout


def test_a_part_written_before_checksums_whose_pages_do_not_decode_is_not_adopted(run):
    part = middle_part(run)
    legacy = part.rename(legacy_name(part))
    zero_bytes(legacy, legacy.stat().st_size // 2)
    with pytest.raises(PartDamagedError, match=re.escape(f"{legacy}: damaged (a page does not decode")):
        LogWriter.open(run, "rounds")
    assert legacy.exists()


def test_the_writer_lock_is_refused_to_a_second_holder(run):
    with LogWriter.open(run, "rounds"), pytest.raises(WriterLockedError, match=f"pid {os.getpid()}"):
        quarantine(EventLog(run, "rounds"), "x")


def _foreign(run: Path, runs: Path, case: str) -> Path:
    """Drop a file that is not the run's into its log/ (the cases of issue 23: found 6, 7 and the forgery)."""
    log = EventLog(run, "rounds")
    if case == "another_runs_part":  # valid, checksummed, wider than the run's first part
        theirs = max(EventLog(runs, "async").parts(), key=lambda p: p.last if p.first == 1 else 0)
        assert theirs.first == 1 and theirs.last > log.parts()[0].last
        target = log.log_dir / theirs.path.name
        target.write_bytes(theirs.path.read_bytes())
    elif case == "same_range_other_content":  # a correct checksum in its name, other events
        part = middle_part(run)
        table = pq.read_table(part).sort_by("seq")
        kinds = table.column("kind").to_pylist()
        table = table.set_column(table.column_names.index("kind"), "kind", pa.array(kinds[::-1]))
        data, digest = encode_part(table, 0)
        first, last = table.column("seq")[0].as_py(), table.column("seq")[-1].as_py()
        target = log.log_dir / part_name(first, last, 0, digest)
        target.write_bytes(data.to_pybytes())
    elif case == "forged_whole_log":  # every score +100, named as a part written before checksums
        table = log.read_table()
        scores = pc.add(table.column("score"), 100.0)
        table = table.set_column(table.column_names.index("score"), "score", scores)
        target = log.log_dir / f"part-{1:012d}-{table.num_rows:012d}-L0.parquet"
        pq.write_table(table, target)
    else:
        target = log.log_dir / "notes.txt"
        target.write_text("a file a tired user saved here\n")
    return target


@pytest.mark.slow
@pytest.mark.parametrize("case", ["another_runs_part", "same_range_other_content", "forged_whole_log", "stray"])
def test_a_file_dropped_into_the_log_is_never_read_and_never_costs_a_genuine_part(runs, run, case):
    log = EventLog(run, "rounds")
    genuine = {p.path.name: p.path.read_bytes() for p in log.parts()}
    trees = json.loads(invoke(run, "replay", "rounds", "--json").stdout)["trees"]
    foreign = _foreign(run, runs, case)
    r = invoke(run, "verify", "rounds")
    assert r.exit_code == 1 and f"FOREIGN  {foreign}" in r.stdout, r.output
    out = json.loads(invoke(run, "verify", "rounds", "--json").stdout)
    assert out["ok"] is False and out["foreign"] == [foreign.name] and out["intact_to"] == out["tail"]
    r = invoke(run, "replay", "rounds", "--json")  # readers read the recorded parts only
    assert r.exit_code == 0 and json.loads(r.stdout)["trees"] == trees and json.loads(r.stdout)["differ"] == 0
    for _attempt in range(2):
        r = invoke(run, "explore", "--resume", "rounds")
        assert r.exit_code == 1 and f"{foreign}: not a part the run's record names" in r.stderr, r.output
        assert f"quarantine rounds {foreign.name}" in r.stderr
        assert {p.path.name: p.path.read_bytes() for p in log.parts()} == genuine
        assert foreign.exists()
    r = invoke(run, "quarantine", "rounds", foreign.name)
    assert r.exit_code == 0 and "the log is unchanged" in r.stdout, r.output
    assert (run_dir(run, "rounds") / "quarantine" / foreign.name).exists() and not foreign.exists()
    assert verify_log(log).ok
    assert invoke(run, "explore", "--resume", "rounds").exit_code == 0  # finished: only summarized
    assert {p.path.name: p.path.read_bytes() for p in log.parts()} == genuine
