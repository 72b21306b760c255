"""The transcripts ``serve``'s search reads (engine/derived/transcripts.py): derived state like any other.

Their rows must be what an independent reading of the log gives; a run that grew is
caught up by reading only its new events; a changed stored file is dropped and built
again (never an answer from it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import hand_run
import pytest

from engine.derived import Derived
from engine.derived.transcripts import INDEX, Transcripts
from engine.export_formats import DEFAULT_WORKSPACE
from ingest.events import RunStarted
from ingest.log import EventLog, LogWriter


def reference(data: Path, run_id: str) -> list[tuple]:
    """Each turn's own messages (from its user prompt on; the last record of a turn), piece by piece."""
    turns = {}
    for batch in EventLog(data, run_id).scan_kind(
        "conversation_recorded", ["seq", "edge_id", "turn", "base", "turn_start", "workspace", "messages"]
    ):
        for row in batch.to_pylist():
            turns[(row["edge_id"], row["turn"])] = row
    names = {}
    rows = []
    for row in turns.values():
        messages = json.loads(row["messages"])
        for m in messages:
            for c in m.get("tool_calls") or []:
                names[(row["edge_id"], c["id"])] = c["function"]["name"]
    for (edge_id, turn), row in turns.items():
        for i, m in enumerate(json.loads(row["messages"]), row["base"]):
            if i < row["turn_start"]:
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content)
            pieces = [("result", content, names.get((edge_id, m.get("tool_call_id"))), m.get("tool_call_id"))]
            if m["role"] != "tool":
                pieces = [("text", content, None, None)]
            pieces.append(("reasoning", m.get("reasoning_content"), None, None))
            pieces += [
                ("call", c["function"]["arguments"], c["function"]["name"], c["id"]) for c in m.get("tool_calls") or []
            ]
            for kind, text, tool, call_id in pieces:
                if text:
                    text = text.replace(row["workspace"], DEFAULT_WORKSPACE) if row["workspace"] else text
                    role = "assistant" if kind == "call" else m["role"]
                    rows.append((edge_id, turn, i, role, kind, tool, call_id, text))
    return sorted(rows, key=repr)


def indexed(files: list[Path]) -> list[tuple]:
    names = ", ".join(f"'{f}'" for f in files)
    found = duckdb.sql(
        f"select edge_id, turn, idx, role, kind, tool, call_id, text from read_parquet([{names}])"
    ).fetchall()
    return sorted(found, key=repr)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("hand") / "data"
    hand_run.write(data)
    return data


@pytest.fixture
def hand(written, tmp_path) -> Path:
    """The hand run's data directory, a copy of one's own (nothing derived yet)."""
    data = tmp_path / "data"
    shutil.copytree(written, data, ignore=shutil.ignore_patterns("derived"))
    return data


def test_the_rows_are_each_turns_own_messages_read_from_the_log(hand):
    rows = indexed(Transcripts(Derived(hand)).files("hand"))
    expected = reference(hand, "hand")
    assert rows == expected
    kinds = {r[4] for r in rows}
    assert kinds == {"text", "reasoning", "call", "result"}  # the hand run has each
    assert all("/runs/hand/worktrees" not in r[7] for r in rows)  # every workspace replaced


def test_a_grown_run_is_caught_up_from_its_new_events_alone(tmp_path):
    data = tmp_path / "data"
    events = hand_run.events()
    half = next(i for i, e in enumerate(events) if getattr(e, "edge_id", None) == "T1.1/e1-1")
    with LogWriter.create(data, "grows") as writer:
        writer.append([RunStarted(command="explore", task="speedup", config=hand_run.CONFIG.model_dump(mode="json"))])
        writer.append(events[:half])
        first = Transcripts(Derived(data))
        before = first.files("grows")
        assert first.built == 1 and indexed(before) == reference(data, "grows")
        writer.append(events[half:])
    after = first.files("grows")
    assert first.built == 2  # one segment more: the new events'
    assert after[0] == before[0] and len(after) == 2
    assert indexed(after) == reference(data, "grows")
    again = Transcripts(Derived(data))  # another reader, another process: reads what is stored
    assert again.files("grows") == after and again.built == 0


@pytest.mark.parametrize("damage", ["segment", "index", "missing"])
def test_a_changed_stored_file_is_dropped_and_built_again(hand, damage, capsys):
    files = Transcripts(Derived(hand)).files("hand")
    place = files[0].parent
    if damage == "segment":
        data = bytearray(files[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        files[0].write_bytes(bytes(data))
    elif damage == "index":
        held = json.loads((place / INDEX).read_text())
        held["tail"] += 1
        (place / INDEX).write_text(json.dumps(held))
    else:
        files[0].unlink()
    reader = Transcripts(Derived(hand))
    rows = indexed(reader.files("hand"))
    assert reader.built == 1 and rows == reference(hand, "hand")
    assert "dropped" in capsys.readouterr().err


def test_verify_lists_the_transcripts_and_names_a_damaged_segment_changing_nothing(hand):
    from click.testing import CliRunner

    from cli import cli

    files = Transcripts(Derived(hand)).files("hand")
    place = files[0].parent
    (found,) = [s for s in Derived(hand).inspect("hand") if s.path == place]
    assert found.current and not found.problems and found.files == len(files) + 1
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    r = CliRunner().invoke(cli, ["--data", str(hand), "verify", "hand"])
    assert r.exit_code == 0, r.output  # the log is sound; derived state is only ever dropped and built again
    damaged = [line for line in r.stdout.splitlines() if line.strip().startswith("DAMAGED")]
    assert len(damaged) == 1 and str(place) in damaged[0] and files[0].name in damaged[0], r.stdout
    assert files[0].read_bytes() == bytes(data)  # verify changed nothing


def test_a_search_of_failed_calls_finds_the_calls_tool_calls_says_failed(hand):
    """The tool-error filter keeps the calls ``tool_calls`` says failed (the knowledge filter joins the same way)."""
    from engine.catalog import Catalog
    from engine.web.data import Source
    from engine.web.search import Query, search

    calls = Catalog.for_log(EventLog(hand, "hand")).query("select call_id, tool, status from tool_calls")
    failed = {c["call_id"] for c in calls if c["status"] == "error" and c["tool"] == "read"}
    read = {c["call_id"] for c in calls if c["tool"] == "read"}
    source = Source(hand)
    found = search(source, Query.of({"tool": "read", "kind": "result", "errors": "1"}))
    assert failed and {h["call_id"] for h in found["hits"]} == failed and found["total"] == len(failed)
    found = search(source, Query.of({"tool": "read", "kind": "result"}))
    assert {h["call_id"] for h in found["hits"]} == read and len(read) > len(failed)
    assert search(source, Query.of({"tool": "read", "kind": "result", "knowledge": "1"}))["total"] == 0  # (none is)


def test_a_search_counts_a_turn_recorded_twice_once_as_its_last_record(hand):
    """A turn's conversation recorded again (a later ConversationRecorded of the same edge and turn): the
    search finds its last record's text, and the first record's pieces neither as hits nor in the counts."""
    from engine.web.data import Source
    from engine.web.search import Query, search
    from ingest.events import ConversationRecorded

    first = next(
        f for f in hand_run.events() if isinstance(f, ConversationRecorded) and (f.edge_id, f.turn) == ("T1.1/e1-1", 2)
    )
    source = Source(hand)
    before = search(source, Query.of({"edge": "T1.1/e1-1"}))
    assert before["total"] > 0
    messages = first.messages
    shown = [i for i, m in enumerate(messages) if i + first.base >= first.turn_start and m.get("content")]
    again = [dict(m) for m in messages]
    again[shown[-1]]["content"] = "zq recorded the second time"
    with LogWriter.open(hand, "hand") as writer:
        writer.append([first.model_copy(update={"messages": again})])
    found = search(Source(hand), Query.of({"q": "zq recorded"}))
    assert found["total"] == 1 and found["hits"][0]["edge_id"] == "T1.1/e1-1" and found["hits"][0]["turn"] == 2
    assert found["attempts_total"] == 1 and found["attempts"][0]["hits"] == 1
    old_text = messages[shown[-1]]["content"]
    old_text = old_text if isinstance(old_text, str) else "".join(p.get("text", "") for p in old_text)
    assert all(h["text"] != old_text for h in search(Source(hand), Query.of({"edge": "T1.1/e1-1"}))["hits"])
    after = search(Source(hand), Query.of({"edge": "T1.1/e1-1"}))
    assert after["total"] == before["total"]  # the same pieces, one of them with the later text


def test_a_search_past_its_memory_limit_says_so(hand):
    """A search holds its hits' keys in memory (nothing spills): it runs under the query limit serve's SQL page
    has, and past it says what stopped it (the page shows the message) instead of taking the machine's memory."""
    from engine.results import Limits, QueryLimitError
    from engine.web.data import Source
    from engine.web.search import Query, search

    query = Query.of({"kind": "result"})
    assert search(Source(hand), query)["total"] > 0
    small = Source(hand, Limits.resolve("2MB"))  # (the collection's queries fit in it: the search's scan does not)
    assert small.collection().query("select count(*) as n from edges")[0]["n"] > 0
    with pytest.raises(QueryLimitError, match="more memory than its limit of 2MB"):
        search(small, query)
