"""Every recorded message of a run as rows to search: derived state, checked when read, caught up as the log grows.

A run's *transcripts* are one row per searchable piece of each turn's own messages
(``ConversationRecorded``; a turn's own messages start at its user prompt): the text of
a message (``kind`` text; a tool message's text is ``result``, with the name of the
call it answers), its reasoning (``reasoning``) and each tool call (``call``: the tool's
name, the arguments as text). ``idx`` is the message's index in the conversation
(the system prompt not counted): the index ``serve``'s compare page anchors it by. The
turn's workspace is replaced by the export's placeholder, as every page shows it.

They are kept under ``<derived>/<run_id>/transcripts/``: segments
``seg<first>_<last>-<digest>.parquet`` (the events ``first`` < seq <= ``last``,
each named by its digest: :mod:`engine.derived.files`) and ``index.json``, a checked
document naming the segments and the record they came from. A reader uses them when
the record is the one they came from; when it grew by appending (``Record.extends``),
only the new events are read from the log, into one more segment (segments are merged
into one past ``MERGE_AT``); otherwise (another record, a quarantine, other code, a
file that fails its check) they are built again from the log, with one line on stderr
for what was damaged. Nothing recorded or exported is read from them.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb

from engine.derived.files import (
    Checked,
    Damaged,
    Outdated,
    discard,
    dump_json,
    load_json,
    split_name,
    unwritable,
    write_named,
)
from engine.derived.states import States
from engine.export_formats import DEFAULT_WORKSPACE
from ingest.errors import LogError
from ingest.listing import while_moving
from ingest.paths import run_dir, write_atomically

DIRECTORY = "transcripts"
INDEX = "index.json"
MERGE_AT = 8  # segments of a run past which they are merged into one
COLUMNS = ["seq", "tree_id", "edge_id", "turn", "base", "turn_start", "workspace", "messages"]

# The rows of a batch of ConversationRecorded events (the Arrow table ``conv``).
ROWS = """
with turns as (
    select seq, tree_id, edge_id, turn, coalesce(base, 0) as base, coalesce(turn_start, 0) as turn_start,
        workspace, cast(coalesce(messages, '[]') as json[]) as ms
    from conv
),
messages as (
    select seq, tree_id, edge_id, turn, workspace, base + k - 1 as idx, ms[k] as m
    from (select *, unnest(range(1, len(ms) + 1)) as k from turns)
    where base + k - 1 >= turn_start
),
calls as (
    select seq, tree_id, edge_id, turn, workspace, idx, c->>'id' as call_id,
        c->'function'->>'name' as tool, c->'function'->>'arguments' as text
    from (select *, unnest(cast(m->'tool_calls' as json[])) as c from messages
          where json_type(m->'tool_calls') = 'ARRAY')
),
pieces as (
    select seq, tree_id, edge_id, turn, workspace, idx, m->>'role' as role,
        case when m->>'role' = 'tool' then 'result' else 'text' end as kind,
        m->>'tool_call_id' as call_id,
        case json_type(m->'content')
            when 'ARRAY' then array_to_string(
                list_transform(cast(m->'content' as json[]), lambda p: coalesce(p->>'text', '')), '')
            else m->>'content' end as text
    from messages
    union all
    select seq, tree_id, edge_id, turn, workspace, idx, m->>'role', 'reasoning', null, m->>'reasoning_content'
    from messages where m->>'reasoning_content' is not null
    union all
    select seq, tree_id, edge_id, turn, workspace, idx, 'assistant', 'call', call_id, text from calls
)
select
    ? as run_id, p.seq, p.tree_id, p.edge_id, p.turn, p.idx, p.role, p.kind,
    case when p.kind = 'call' then c.tool when p.kind = 'result' then r.tool end as tool,
    p.call_id,
    case when p.workspace is null or p.workspace = '' then p.text else replace(p.text, p.workspace, ?) end as text
from pieces as p
left join calls as c on p.kind = 'call' and c.seq = p.seq and c.idx = p.idx and c.call_id = p.call_id
left join (select distinct edge_id, call_id, tool from calls) as r
    on p.kind = 'result' and r.edge_id = p.edge_id and r.call_id = p.call_id
where p.text is not null and p.text <> ''
order by p.seq, p.idx, p.kind, p.call_id
"""


def code_key() -> str:
    """What the rows are made by (this module's source, and the placeholder they say for a worktree): rows made
    by other code are built again."""
    return hashlib.sha256(Path(__file__).read_bytes() + DEFAULT_WORKSPACE.encode()).hexdigest()[:16]


class Transcripts:
    """The transcripts of the runs of one data directory (kept where its derived state is kept)."""

    def __init__(self, derived: States) -> None:
        self.derived = derived
        self.code = code_key()
        self._lock = threading.Lock()  # one builder of a run's segments at a time in this process
        self.checks = Checked()  # the segments checked, each by its stat then
        self.built = 0  # segments written by this instance (a test counts them)

    def files(self, run_id: str) -> list[Path]:
        """The checked segment files of ``run_id``'s transcripts as its log stands now (made or caught up here)."""
        with self._lock:
            return while_moving(  # (a segment merged away by another process meanwhile: read again)
                run_dir(self.derived.data_dir, run_id) / "log",
                lambda: self._current(run_id, missing_is_damage=False),
                "its transcripts kept changing while read - try again",
                last=lambda: self._current(run_id, missing_is_damage=True),
            )

    def _current(self, run_id: str, missing_is_damage: bool) -> list[Path]:
        from ingest.log import EventLog

        source = self.derived.source(run_id)
        identity = f"{run_id}/{DIRECTORY}"
        base: dict[str, Any] | None = None
        for root in self.derived.roots.all:
            place = root / run_id / DIRECTORY
            try:
                held = load_json(place / INDEX, identity)
                if held is None or held.get("code") != self.code or held.get("identity") != source.identity:
                    continue
                segments = [place / name for name, _first, _last in held["segments"]]
                current = (held["entries"], held["last_sha"]) == (source.entries, source.last_sha)
                record = None if current else EventLog(self.derived.data_dir, run_id).record()
                if not current and (record is None or not record.extends(held["entries"], held["last_sha"])):
                    continue
                for path in segments:
                    self.checks.check(path, identity, f"named by {INDEX}" if missing_is_damage else None)
                if current:
                    return segments
                if base is None or held["tail"] > base["tail"]:
                    base = held | {"place": place}
            except Outdated:
                continue
            except (Damaged, KeyError, TypeError, ValueError) as why:
                self._drop(place, str(why))
        return self._build(run_id, source, base, identity)

    def _build(self, run_id: str, source, base: dict[str, Any] | None, identity: str) -> list[Path]:
        from ingest.log import EventLog

        log = EventLog(self.derived.data_dir, run_id)
        after = base["tail"] if base else 0
        segments = [list(s) for s in base["segments"]] if base else []
        for _attempt in range(2):
            root = self.derived.roots.writable
            place = root / run_id / DIRECTORY
            try:
                place.mkdir(parents=True, exist_ok=True)
                if base and base["place"] != place:  # (its root is not writable any more)
                    for name, _first, _last in segments:
                        shutil.copyfile(base["place"] / name, place / name)
                rows = self._rows(log, run_id, after, source.tail)
                if rows.num_rows:
                    segments.append(
                        [self._write(place, identity, f"seg{after}_{source.tail}", rows), after, source.tail]
                    )
                if len(segments) > MERGE_AT:
                    segments = [[self._merge(place, identity, segments), 0, source.tail]]
                body = {
                    "code": self.code,
                    "identity": source.identity,
                    "entries": source.entries,
                    "last_sha": source.last_sha,
                    "tail": source.tail,
                    "segments": segments,
                }
                write_atomically(place / INDEX, dump_json(identity, body), durable=False)
                self._collect(place, {name for name, _f, _l in segments})
                return [place / name for name, _first, _last in segments]
            except OSError as err:
                if not unwritable(err):
                    raise
                self.derived.roots.refused(root, err)
        raise LogError(f"{run_id}: its transcripts could not be kept")  # (refused raises first)

    def _rows(self, log, run_id: str, after: int, upto: int):
        import pyarrow as pa

        batches = list(log.scan_kind("conversation_recorded", COLUMNS, upto, 4096, after=after))
        con = duckdb.connect(config={"temp_directory": ""})
        try:
            if not batches:
                return pa.table({})
            con.register("conv", pa.concat_tables(batches))
            return con.sql(ROWS, params=[run_id, DEFAULT_WORKSPACE]).to_arrow_table()
        finally:
            con.close()

    def _write(self, place: Path, identity: str, stem: str, rows) -> str:
        import pyarrow.parquet as pq

        path = write_named(place, stem, identity, lambda tmp: pq.write_table(rows, tmp, compression="zstd"))
        self.built += 1
        self.checks.add(path)
        return path.name

    def _merge(self, place: Path, identity: str, segments: list[list]) -> str:
        import pyarrow.parquet as pq

        rows = pq.read_table([str(place / name) for name, _f, _l in segments])
        return self._write(place, identity, f"seg0_{segments[-1][2]}", rows)

    def _collect(self, place: Path, keep: set[str]) -> None:
        """Remove the segments the index no longer names (a reader holding one reads again when it is gone)."""
        for path in place.glob("seg*.parquet"):
            if split_name(path.name) is not None and path.name not in keep:
                discard(path)
                self.checks.forget(path)

    def _drop(self, place: Path, why: str) -> None:
        print(f"note: derived state {place} dropped ({why}); derived again from the log", file=sys.stderr)
        shutil.rmtree(place, ignore_errors=True)
        self.checks.forget(place)
