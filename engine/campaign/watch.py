"""Watching a campaign another process runs: its rounds and budget, and a line per task's run, as the logs grow.

As ``engine.watch`` follows one run: each run's catalog is its stored derived state,
then the whole parts its writer publishes; the campaign's log is read again at each
look (a few events a round). Following ends once the campaign has finished, or with an
error once no process writes it any more.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import watchfiles

from engine.campaign.policy import spent
from engine.catalog import Catalog
from engine.runset import Reader, campaign_log, campaign_tasks, open_campaign
from engine.watch import writer_alive
from ingest.errors import LogError
from ingest.log import EventLog
from ingest.paths import command_line

Row = dict[str, Any]


@dataclass
class CampaignFrame:
    """One moment of a campaign: its state and budget, and each run's progress and spend."""

    name: str
    config: Row  # campaign_config
    state: Row  # campaign_state
    runs: list[Row]  # run_id, task, then run_progress, run_pace and campaign_spend's columns
    writing: bool = True

    @property
    def finished(self) -> bool:
        return bool(self.state["finished"])

    @property
    def spent(self) -> tuple[int, int]:
        """Valid edges and tokens spent over the runs."""
        return spent(self.runs)

    @property
    def seqs(self) -> tuple:
        return (self.state["rounds"], self.state["finished"], *(r["seq"] for r in self.runs))


def read_campaign_frame(reader: Reader, name: str, catalogs: dict[str, Catalog], writing: bool) -> CampaignFrame:
    """The frame of the campaign's log now and of what ``catalogs`` hold of its runs (opened through ``reader``
    as they appear)."""
    data_dir = reader.data_dir
    campaign = open_campaign(data_dir, name)
    runs = []
    for task in campaign_tasks(campaign):
        run_id = task["task_run"]
        log = EventLog(data_dir, run_id)
        if run_id not in catalogs:
            if not log.exists():
                continue
            catalogs[run_id] = reader.open(run_id)
        catalog = catalogs[run_id]
        catalog.load(log)
        row = {"run_id": run_id, "task": task["task"], "seq": catalog.tail_seq()}
        for view in ("run_progress", "run_pace", "campaign_spend"):
            row |= catalog.query(f"select * from {view}")[0]
        runs.append(row)
    config = campaign.query("select * exclude (config_json) from campaign_config")[0]
    state = campaign.query("select * from campaign_state")[0]
    return CampaignFrame(name, config, state, runs, writing)


def follow_campaign(
    reader: Reader, name: str, period: float = 5.0, stop: threading.Event | None = None
) -> Iterator[CampaignFrame]:
    """Frames of a campaign, every run's catalog read through ``reader`` (the process's): one now, then one per
    change (or per ``period`` s), until it finishes."""
    data_dir = reader.data_dir
    log = campaign_log(data_dir, name)
    catalogs: dict[str, Catalog] = {}
    frame = read_campaign_frame(reader, name, catalogs, writer_alive(log))
    yield frame
    if frame.finished:
        return
    watched = [log.log_dir, *(EventLog(data_dir, r["run_id"]).log_dir for r in frame.runs)]
    for changes in watchfiles.watch(
        *watched, rust_timeout=int(period * 1000), yield_on_timeout=True, stop_event=stop, raise_interrupt=True
    ):
        writer_gone = not changes and not writer_alive(log)
        frame = read_campaign_frame(reader, name, catalogs, not writer_gone)
        yield frame
        if frame.finished:
            return
        if writer_gone:
            raise LogError(
                f"campaign {name!r} is not finished and no process runs it any more (none holds "
                f"{log.dir / 'writer.lock'}) - continue it with: {command_line(data_dir, 'campaign', '--resume', name)}"
            )
