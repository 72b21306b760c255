"""The features of an export's rows, for its dataset card: every column's type over every row.

A loader that infers a schema from the first rows (``datasets`` reads a JSON file's first
block) fails on a later row holding a field the first ones lacked (a message's
``reasoning_content``, a tool call's argument). The card declares the features instead,
merged over every row of every file written (:class:`RowShapes`): a JSON object is a
struct of every key any row gave it, a list a list of its merged items, integers and
floats together floats, a missing or null value no constraint; values no Arrow type holds
together (text here, a list there) are ``json`` (``datasets``' ``Json`` feature: the
value as it is). Shapes are nested tuples: ``("value", dtype)``, ``("list", item)``,
``("struct", ((name, shape), ...))``, ``("json",)``, ``NULL``.
"""

from __future__ import annotations

import io
import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

NULL = ("value", "null")
JSON = ("json",)
_SCALARS = {bool: ("value", "bool"), int: ("value", "int64"), float: ("value", "float64"), str: ("value", "string")}
CHUNK = 4 << 20  # bytes of rows Arrow types at a time
BLOCK = 1 << 20  # Arrow's JSON reader parses a chunk in blocks of this size, in order


class RowShapes:
    """The shape of the JSON lines added, merged, a struct's fields in the order the rows first give
    them. Arrow's JSON reader types a chunk of them at a time (C++, without the GIL, its blocks in
    order: faster than walking rows in Python) on a thread of its own, so the rows go on being made
    meanwhile; a chunk whose values Arrow cannot type together (text here, a list there) is walked
    in Python instead."""

    def __init__(self) -> None:
        self._shape = NULL
        self._buffer = bytearray()
        self._pending: list[Future] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="row-shapes")

    def add(self, line: bytes) -> None:
        """One row: a line of compact JSON ending with a newline."""
        self._buffer += line
        if len(self._buffer) >= CHUNK:
            self._submit()

    def shape(self) -> tuple:
        """Every row's shape merged (the rows added so far; waits for what is being typed)."""
        self._submit()
        while self._pending:
            self._shape = merge(self._shape, self._pending.pop(0).result())
        return self._shape

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)

    def _submit(self) -> None:
        while self._pending and self._pending[0].done():  # (their chunks freed as they are merged)
            self._shape = merge(self._shape, self._pending.pop(0).result())
        if self._buffer:
            self._pending.append(self._pool.submit(chunk_shape, bytes(self._buffer)))
            self._buffer = bytearray()


def chunk_shape(chunk: bytes) -> tuple:
    """The shape of the rows of a chunk of JSON lines."""
    try:
        options = pajson.ReadOptions(use_threads=False, block_size=BLOCK)  # (threads order new fields at random)
        schema = pajson.read_json(io.BytesIO(chunk), read_options=options).schema
        return _arrow_shape(pa.struct(list(schema)))
    except pa.ArrowInvalid:
        shape = NULL
        for line in chunk.splitlines():
            shape = merge(shape, shape_of(json.loads(line)))
        return shape


def _arrow_shape(kind: pa.DataType) -> tuple:
    if pa.types.is_struct(kind):
        return ("struct", tuple((f.name, _arrow_shape(f.type)) for f in kind))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return ("list", _arrow_shape(kind.value_type))
    if pa.types.is_null(kind):
        return NULL
    if pa.types.is_boolean(kind):
        return ("value", "bool")
    if pa.types.is_integer(kind):
        return ("value", "int64")
    if pa.types.is_floating(kind):
        return ("value", "float64")
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_temporal(kind):
        return ("value", "string")  # (a text Arrow read as a time is text in the row)
    return JSON


def shape_of(value: Any) -> tuple:
    """The shape of one JSON value."""
    kind = type(value)
    if kind in _SCALARS:
        return _SCALARS[kind]
    if value is None:
        return NULL
    if kind is list:
        item = NULL
        for v in value:
            item = merge(item, shape_of(v))
        return ("list", item)
    if kind is dict:
        return ("struct", tuple((k, shape_of(v)) for k, v in value.items()))
    return JSON


def merge(a: tuple, b: tuple) -> tuple:
    """The shape that holds values of both shapes."""
    if a == b or b == NULL:
        return a
    if a == NULL:
        return b
    if {a, b} == {("value", "int64"), ("value", "float64")}:
        return ("value", "float64")
    if a[0] == b[0] == "list":
        return ("list", merge(a[1], b[1]))
    if a[0] == b[0] == "struct":
        fields = dict(a[1])
        for name, shape in b[1]:
            fields[name] = merge(fields[name], shape) if name in fields else shape
        return ("struct", tuple(fields.items()))
    return JSON


def yaml_features(shape: tuple, indent: int = 0) -> list[str]:
    """The ``features:`` list of a row shape (a struct) as dataset-card YAML lines, each key quoted."""
    assert shape[0] == "struct", shape
    lines: list[str] = []
    pad = " " * indent
    for name, field in shape[1]:
        lines.append(f"{pad}- name: {json.dumps(name)}")
        lines += _type_lines(field, indent + 2)
    return lines


def _type_lines(shape: tuple, indent: int) -> list[str]:
    pad = " " * indent
    if shape[0] == "value":
        return [f"{pad}dtype: {json.dumps(shape[1])}"]  # (quoted: a bare null is YAML's null)
    if shape == JSON:
        return [f'{pad}dtype: "json"']
    if shape[0] == "struct":
        return [f"{pad}struct:", *yaml_features(shape, indent)] if shape[1] else [f"{pad}struct: []"]
    item = shape[1]
    if item[0] == "value" or item == JSON:
        return [f"{pad}list: {json.dumps('json' if item == JSON else item[1])}"]
    if item[0] == "struct":
        return [f"{pad}list:", *yaml_features(item, indent)] if item[1] else [f"{pad}list:", f"{pad}  struct: []"]
    return [f"{pad}list:", *_type_lines(item, indent + 2)]
