"""The event store contract: every way events are stored gives back the same events.

One event of every kind, every field set to a value unlike its default, goes through
the log (Parquet parts), the catalog (DuckDB tables, light columns only) and the
spool (Arrow IPC files), and must come back equal.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args, get_origin

import pytest
from conftest import ROOT

from engine.catalog import KIND_COLUMNS, Catalog
from engine.mcts.spool import Spool
from ingest.events import EVENT_TYPES, Event, edge_id
from ingest.log import EventLog, LogWriter
from ingest.schema import HEAVY_FIELDS, JSON_FIELDS, from_row, to_arrow


def _value(name: str, annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return args[-1]
    if args and get_origin(annotation) not in (dict, list):
        return _value(name, args[0])
    if name in JSON_FIELDS:
        if get_origin(annotation) is list:
            return [{"k": 1, "z": [1.5, "x"]}]
        key, value = get_args(annotation)
        if value in (float, int):
            return {"b": 3, "a": -1} if value is int else {"b": 0.25, "a": -1.5}
        return {"b": [1, {"c": None}], "a": "é"}
    return {str: f"{name} value ü", int: 7, float: 2.5, bool: True}[annotation]


def one_of_each() -> list[Event]:
    """An event of every kind with every field set (edge ids follow their format)."""
    events = []
    for cls in EVENT_TYPES.values():
        values = {n: _value(n, f.annotation) for n, f in cls.model_fields.items() if n != "schema_version"}
        if "parent_id" in values and "slot" in values:
            values["edge_id"] = edge_id(values["parent_id"], values["slot"], values["attempt"])
        events.append(cls(**values))
    return events


def light(event: Event) -> Event:
    """The event as the catalog holds it: heavy fields at their defaults."""
    heavy = {
        n: f.get_default(call_default_factory=True) for n, f in type(event).model_fields.items() if n in HEAVY_FIELDS
    }
    return event.model_copy(update=heavy)


EVENTS = one_of_each()


def test_every_kind_is_covered():
    assert {e.kind for e in EVENTS} == set(EVENT_TYPES) == set(KIND_COLUMNS)


def test_the_log_gives_back_every_event(data_dir):
    with LogWriter.create(data_dir, "r") as writer:
        writer.append(EVENTS)
    rows = EventLog(data_dir, "r").read_table().to_pylist()
    assert [from_row(r) for r in rows] == EVENTS
    assert [r["seq"] for r in rows] == list(range(1, len(EVENTS) + 1))


def test_the_spool_gives_back_every_event(tmp_path):
    spool = Spool(tmp_path)
    spool.put("T1/e1-1", 1, EVENTS)
    assert spool.take("T1/e1-1", 1) == EVENTS


@pytest.mark.parametrize("way", ["inserted", "loaded"])
def test_the_catalog_gives_back_every_event_without_its_heavy_fields(data_dir, way):
    if way == "inserted":
        catalog = Catalog.empty()
        catalog.insert(to_arrow(EVENTS, "r", 1, datetime.now(UTC)))
    else:
        with LogWriter.create(data_dir, "r") as writer:
            writer.append(EVENTS)
        catalog = Catalog.for_log(EventLog(data_dir, "r"))
    got = []
    for kind in KIND_COLUMNS:
        got += [(r["seq"], from_row(r)) for r in catalog.query(f"select * from log_{kind}")]
    assert [e for _, e in sorted(got, key=lambda x: x[0])] == [light(e) for e in EVENTS]


def test_the_edge_id_format_is_the_same_in_python_and_sql():
    con = Catalog.empty().con
    for parent, slot, attempt in (("T001", 1, 1), ("T001.2.10", 3, 2), ("T-9.1", 12, 1)):
        sql_id, parts = con.execute(
            "select edge_id(?, ?, ?), edge_parts(edge_id(?, ?, ?))", [parent, slot, attempt] * 2
        ).fetchone()
        assert sql_id == edge_id(parent, slot, attempt)
        assert parts == {"parent_id": parent, "slot": slot, "attempt": attempt}


def test_text_without_a_utf8_form_is_stored_with_u_fffd_json_included():
    """A lone surrogate (a non-UTF-8 byte Python kept, or a JSON "\\ud800" escape) has no
    UTF-8 form: Arrow refused the text, and DuckDB's JSON refused it escaped."""
    import json

    import duckdb

    from ingest.events import RunStarted

    event = RunStarted(command="explore", task="t\udcff", config={"task": "t\udcff", "notes": ["\ud800", "😀"]})
    table = to_arrow([event], "r", 1, datetime.now(UTC))  # noqa: F841 - read by DuckDB
    task, config = duckdb.connect().execute('select task, json(config) from "table"').fetchone()
    assert task == "t\ufffd"
    assert json.loads(config) == {"task": "t\ufffd", "notes": ["\ufffd", "😀"]}


def test_the_columns_written_out_are_what_the_models_define_and_a_difference_is_named():
    """ingest/columns.py (what readers import, without the models) says what ingest/events.py's models say."""
    import subprocess
    import sys

    from ingest import columns
    from ingest.schema import columns_of_models

    assert columns_of_models() == (columns.FIELD_TYPES, columns.JSON_FIELDS, columns.HEAVY_FIELDS, columns.KIND_FIELDS)
    # a field added to a model without writing the columns again: ingest.schema refuses to load, naming it
    script = (
        "import ingest.columns as c; c.KIND_FIELDS = {**c.KIND_FIELDS, 'run_finished': ('extra',)}; "
        "import ingest.schema"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and "ingest/columns.py's KIND_FIELDS" in done.stderr


def test_reading_a_log_into_a_catalog_does_not_import_the_event_models():
    import subprocess
    import sys

    script = (
        "import sys; from engine.catalog import Catalog; import engine.catalog.tables, engine.runs, "
        "engine.derived.store, engine.derived.catalogs; print(sorted(m for m in ('ingest.events', 'ingest.schema', "
        "'ingest.writer') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"
