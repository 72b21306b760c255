"""Opening a recorded run: its catalog, once the configuration it records is valid."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
from pydantic import ValidationError

from engine.catalog import Catalog
from engine.config import RunConfig, problems
from ingest.errors import LogError
from ingest.log import EventLog


def open_run(data_dir: Path, run_id: str, threads: int | None = None) -> Catalog:
    """A catalog over the published prefix of a run whose recorded config is valid.

    LogError names the run when it does not exist, and the log when its recorded
    config is not one this version accepts (a forged or damaged log: the views
    could not use it).
    """
    log = EventLog(data_dir, run_id).require()
    catalog = Catalog.for_log(log, threads=threads)
    recorded_config(catalog, log)
    return catalog


def each_run(data_dir: Path, run_ids: list[str]) -> Iterator[tuple[EventLog, Catalog]]:
    """Each run's log and an empty catalog for it, one run at a time, in one DuckDB instance.

    Every run is checked to exist first. A catalog is a database of its own, its
    definitions copied from the instance's template (the views are created once, not
    once a run), and is dropped when the caller asks for the next one: a collection
    of any size is held one run at a time.
    """
    logs = [EventLog(data_dir, run_id).require() for run_id in dict.fromkeys(run_ids)]
    con = duckdb.connect()
    try:
        for i, log in enumerate(logs, start=1):
            catalog = Catalog.inside(con, f"run_{i}")
            try:
                yield log, catalog
            finally:
                catalog.con.close()
                con.execute(f"detach run_{i}")
    finally:
        con.close()


def recorded_config(catalog: Catalog, log: EventLog) -> RunConfig:
    """The configuration the run's first event records, validated."""
    rows = catalog.query("select config from stg_run_started order by seq limit 1")
    if not rows:
        raise LogError(f"{log.dir}: the log has no RunStarted event - not a run of this tool")
    recorded = {k: v for k, v in json.loads(rows[0]["config"]).items() if k != "source"}
    try:
        return RunConfig.model_validate(recorded)
    except ValidationError as err:
        raise LogError(f"{log.dir}: the recorded run config is not valid ({problems(err)})") from err
