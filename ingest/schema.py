"""The log's one wide Arrow schema, and events to rows and back.

An envelope (``run_id``, ``seq``, ``kind``, ``schema_version``, ``recorded_at``)
plus one typed column per model field of :mod:`ingest.events`, shared by every kind
that has a field of that name; fields a kind does not have are null in its rows.
Dicts and lists are stored as JSON text with sorted keys, so equal events give
byte-equal rows.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal, get_args, get_origin

import pyarrow as pa

from ingest.columns import ENVELOPE, FIELD_TYPES, HEAVY_FIELDS, JSON_FIELDS, KIND_FIELDS, SCHEMA
from ingest.columns import fits_int64 as fits_int64  # (re-exported)
from ingest.events import EVENT_TYPES, Event, as_utf8

_SCALARS = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def _arrow_type(annotation: Any) -> tuple[pa.DataType, bool]:
    """Arrow type of a field annotation, and whether it is stored as JSON text."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin is Literal:
        return _arrow_type(type(args[0]))
    if args and origin not in (dict, list):  # X | None
        return _arrow_type(args[0]) if len(args) == 1 else (pa.string(), True)
    if annotation in _SCALARS:
        return _SCALARS[annotation], False
    return pa.string(), True


def columns_of_models() -> tuple[dict[str, pa.DataType], frozenset[str], frozenset[str], dict[str, tuple[str, ...]]]:
    """The columns the event models define: each field's type, the JSON and the heavy fields, each kind's own."""
    types: dict[str, pa.DataType] = {}
    json_fields: set[str] = set()
    heavy: set[str] = set()
    for kind, cls in EVENT_TYPES.items():
        for name, field in cls.model_fields.items():
            if name == "schema_version":
                continue
            typ, is_json = _arrow_type(field.annotation)
            if name in types and types[name] != typ:
                msg = f"field {name!r} of {kind} is {typ}, elsewhere {types[name]}"
                raise TypeError(msg)
            types[name] = typ
            if is_json:
                json_fields.add(name)
            if (field.json_schema_extra or {}).get("heavy"):
                heavy.add(name)
    kinds = {k: tuple(f for f in c.model_fields if f != "schema_version") for k, c in EVENT_TYPES.items()}
    return dict(sorted(types.items())), frozenset(json_fields), frozenset(heavy), kinds


def _check_columns() -> None:
    """ingest/columns.py must say what the models say (checked whenever events are written or read as models)."""
    found = columns_of_models()
    held = (FIELD_TYPES, JSON_FIELDS, HEAVY_FIELDS, KIND_FIELDS)
    names = ("FIELD_TYPES", "JSON_FIELDS", "HEAVY_FIELDS", "KIND_FIELDS")
    for name, model, constant in zip(names, found, held, strict=True):
        if model != constant:
            raise TypeError(f"ingest/columns.py's {name} is not what ingest/events.py's models define: write it again")


_check_columns()
_FIELDS = KIND_FIELDS
# Columns that change from one identical run to the next (never compared, never decided on).
WALL_CLOCK_COLUMNS = frozenset({"recorded_at", "started_at", "wall_seconds"})
_ORDER = {name: i for i, name in enumerate(SCHEMA.names)}


def to_row_values(event: Event) -> dict[str, Any]:
    """The column values of one event (without the envelope)."""
    values = {}
    for name in type(event).model_fields:
        if name == "schema_version":
            continue
        value = getattr(event, name)
        if name in JSON_FIELDS and value is not None:
            value = _json(value)
        values[name] = value
    return values


def _json(value: Any) -> str:
    """JSON text of a field's value; a lone surrogate in it (which DuckDB's JSON refuses) as U+FFFD."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if "\\ud" in text:  # a surrogate escaped: a valid pair (an emoji), or a lone one
        text = json.dumps(_utf8_values(value), sort_keys=True, separators=(",", ":"))
    return text


def _utf8_values(value: Any) -> Any:
    if isinstance(value, str):
        return as_utf8(value)
    if isinstance(value, dict):
        return {as_utf8(str(k)): _utf8_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_utf8_values(v) for v in value]
    return value


def to_arrow(events: list[Event], run_id: str, first_seq: int, recorded_at: datetime) -> pa.Table:
    """Build the Arrow table of ``events`` numbered from ``first_seq``, in order.

    The table has the envelope and the fields of the kinds present (a subset of
    SCHEMA, in SCHEMA's order); readers fill absent columns with nulls.
    """
    n = len(events)
    names = sorted({f for e in events for f in _FIELDS[e.kind]}, key=_ORDER.__getitem__)
    columns: dict[str, list[Any]] = {name: [None] * n for name in names}
    for i, event in enumerate(events):
        for name, value in to_row_values(event).items():
            columns[name][i] = value
    arrays = [
        pa.array([run_id] * n, pa.string()),
        pa.array(range(first_seq, first_seq + n), pa.int64()),
        pa.array([e.kind for e in events], pa.string()),
        pa.array([e.schema_version for e in events], pa.int32()),
        pa.array([recorded_at] * n, pa.timestamp("us", tz="UTC")),
    ]
    arrays += [_array(columns[name], FIELD_TYPES[name]) for name in names]
    return pa.Table.from_arrays(arrays, schema=pa.schema(list(ENVELOPE) + [SCHEMA.field(x) for x in names]))


def _array(values: list[Any], type_: pa.DataType) -> pa.Array:
    """One column; text without a UTF-8 form (a lone surrogate) is stored as :func:`as_utf8` gives it."""
    try:
        return pa.array(values, type_)
    except UnicodeEncodeError:  # rare: the check costs nothing until it happens
        return pa.array([as_utf8(v) if isinstance(v, str) else v for v in values], type_)


def from_row(row: dict[str, Any]) -> Event:
    """Rebuild the event of one stored row (envelope columns are ignored)."""
    cls = EVENT_TYPES[row["kind"]]
    values = {}
    for name in cls.model_fields:
        if name not in row:
            continue
        value = row[name]
        if name in JSON_FIELDS and isinstance(value, str):
            value = json.loads(value)
        values[name] = value
    return cls.model_validate({k: v for k, v in values.items() if v is not None})
