"""The append-only Parquet event log: one directory per run, immutable parts, a record of them.

Layout of a run::

    <data>/runs/<run_id>/
        writer.lock                      held (flock) by the one process that appends
        log/_record.jsonl                the committed list of the log's parts (record)
        log/part-<first>-<last>-L<k>-<sha>.parquet   published parts, never modified
        log/.tmp-*                        writes not yet published (the writer finishes or removes them)
        spool/                            finished turns not yet appended (engine)
        quarantine/                       files moved aside by ``quarantine`` (integrity)

The rooms: ``paths`` (run ids and directories), ``parts`` (part names, checksums),
``encoding`` (a part's columns, row groups and bytes), ``checks`` (what a reader checks
before it uses a part), ``record`` (which parts make the log), ``reader``
(:class:`EventLog`), ``writer`` (:class:`LogWriter`, its lock, compaction). This module gathers their public names.
Sequence numbers are assigned by the writer, per run, without gaps.
"""

from __future__ import annotations

from ingest.checks import (
    CHECKSUM_MISMATCH,
    check_part,
    content_problem,
    damaged_part,
    part_schema,
    unreadable_part,
)
from ingest.encoding import GROUP_SHARE, encode_part, write_part
from ingest.parts import DIGEST_CHARS, PART_RE, Part, content_digest, part_name
from ingest.paths import DATA_ENV, RUN_ID_RE, check_run_id, default_data_dir, fsync_dir, run_dir
from ingest.reader import EventLog, run_ids
from ingest.record import RECORD, Record, RecordDamagedError, read_record
from ingest.writer import CACHED_LEVELS, FANOUT, LogWriter, WriterLock

__all__ = [
    "CACHED_LEVELS",
    "CHECKSUM_MISMATCH",
    "DATA_ENV",
    "DIGEST_CHARS",
    "FANOUT",
    "GROUP_SHARE",
    "PART_RE",
    "RECORD",
    "RUN_ID_RE",
    "EventLog",
    "LogWriter",
    "Part",
    "Record",
    "RecordDamagedError",
    "WriterLock",
    "check_part",
    "check_run_id",
    "content_digest",
    "content_problem",
    "damaged_part",
    "default_data_dir",
    "encode_part",
    "fsync_dir",
    "part_name",
    "part_schema",
    "read_record",
    "run_dir",
    "run_ids",
    "unreadable_part",
    "write_part",
]
