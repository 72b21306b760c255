"""Session variables: the one way to set them, and what each one makes stale.

Views read parameters only through ``getvariable('<name>')`` (directly or in a
macro of ``_macros.sql``): the log prefix (``watermark``), replay's evaluation
points (``asof_points``), a reselection's weights (``path_w_*``, ``path_top_k``,
``path_diversity``), a supervision rule (``supervision_*``), the knowledge patterns.
Setting one makes every materialized table that reads it, directly or through views,
stale as a whole; the catalog recomputes those tables
when a query next reads them. Internal variables that a statement only reads while
it runs (the trees being refreshed, the files being loaded) are set with
:meth:`Variables.scoped`, which makes nothing stale.

A view may give variables their defaults from its single row (header line
``-- variables: name = column``): the catalog sets them whenever events of a
kind that view reads arrive, unless the caller has set them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb

from engine.catalog.definitions import ViewGraph

_UNSET = object()


class Variables:
    """The session variables of one catalog connection."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, graph: ViewGraph, invalidate: Callable[[set[str]], None]
    ) -> None:
        self.con = con
        self._invalidate = invalidate
        self.affects: dict[str, set[str]] = graph.variable_tables  # variable -> the tables it makes stale
        self._values: dict[str, Any] = {}
        self._explicit: set[str] = set()

    @property
    def values(self) -> dict[str, Any]:
        """The variables set, with their values."""
        return dict(self._values)

    @property
    def names(self) -> list[str]:
        """Every variable some view reads."""
        return sorted(self.affects)

    def set(self, **values: Any) -> None:
        """Set (None: reset) variables; the tables that read them become stale."""
        self._assign(values)
        self._explicit |= set(values)

    def set_default(self, name: str, value: Any) -> None:
        """Set a variable unless the caller has set it (a view's ``variables`` default)."""
        if name not in self._explicit and self._values.get(name, _UNSET) != value:
            self._assign({name: value})

    def restore(self, values: dict[str, Any], explicit: set[str]) -> None:
        """Take the variables of a saved catalog whose tables were derived under them (nothing becomes stale)."""
        for name, value in values.items():
            self.con.execute(f"set variable {name} = ?", [value])
        self._values = dict(values)
        self._explicit = set(explicit)

    @property
    def explicit(self) -> set[str]:
        """The variables the caller set (the others hold a view's default)."""
        return set(self._explicit)

    @contextmanager
    def using(self, **values: Any) -> Iterator[None]:
        """Set variables for the duration of a block, then restore what they were."""
        before = {k: self._values.get(k) for k in values}
        explicit = self._explicit & set(values)
        self.set(**values)
        try:
            yield
        finally:
            self._assign(before)
            self._explicit = (self._explicit - set(values)) | explicit

    @contextmanager
    def scoped(self, **values: Any) -> Iterator[None]:
        """Set internal variables that the block's statements read; nothing becomes stale."""
        for name, value in values.items():
            self.con.execute(f"set variable {name} = ?", [value])
        try:
            yield
        finally:
            for name in values:
                self.con.execute(f"reset variable {name}")

    def _assign(self, values: dict[str, Any]) -> None:
        stale: set[str] = set()
        for name, value in values.items():
            if name not in self.affects:
                known = ", ".join(self.names)
                raise KeyError(f"no view reads the variable {name!r} (known: {known})")
            if value is None:
                self.con.execute(f"reset variable {name}")
                self._values.pop(name, None)
            else:
                self.con.execute(f"set variable {name} = ?", [value])
                self._values[name] = value
            stale |= self.affects[name]
        if stale:
            self._invalidate(stale)
