"""The features of an export's rows, for its dataset card: every column's type over every row.

A loader that infers a schema from the first rows (``datasets`` reads a JSON file's first
block) fails on a later row holding a field the first ones lacked (a message's
``reasoning_content``, a tool call's argument). The card declares the features instead,
merged over every row written: a JSON object is a struct of every key any row gave it, a
list a list of its merged items, integers and floats together floats, a missing or null
value no constraint; values no Arrow type holds together (text here, a list there) are
``json`` (``datasets``' ``Json`` feature: the value as it is). Shapes are nested tuples:
``("value", dtype)``, ``("list", item)``, ``("struct", ((name, shape), ...))``, ``("json",)``,
``NULL``.
"""

from __future__ import annotations

import json
from typing import Any

NULL = ("value", "null")
JSON = ("json",)
_SCALARS = {bool: ("value", "bool"), int: ("value", "int64"), float: ("value", "float64"), str: ("value", "string")}


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
