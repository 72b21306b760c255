"""A campaign started (``campaign CAMPAIGN.toml``) or resumed (``--resume``), and what it sums up to.

The package's docstring (``engine/campaign/__init__.py``) says how a campaign runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import __version__
from engine.campaign.config import load_campaign
from engine.campaign.log import recorded_campaign, task_run_id
from engine.campaign.loop import Report, drive, plan_task
from engine.catalog import Catalog
from engine.runset import CAMPAIGN_VIEWS, campaign_log, campaign_runs, open_campaign
from ingest.errors import InputError
from ingest.events import CampaignTaskAdded, RunResumed, RunStarted
from ingest.log import EventLog, LogWriter, check_run_id
from ingest.names import CAMPAIGN, RUN, claimed, refuse_clashes
from ingest.paths import campaigns_dir

if TYPE_CHECKING:
    from engine.collection import Collection


@dataclass
class CampaignResult:
    """What a campaign holds: its name, policy, whether it was resumed, its runs and totals."""

    name: str
    policy: str
    resumed: bool
    runs: list[str]
    rounds: int
    stop_reason: str | None
    summary: list[dict[str, Any]] = field(default_factory=list)


def new_campaign(
    data_dir: Path,
    path: Path,
    name: str | None = None,
    *,
    parallel: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    report: Report | None = None,
    on_start: Callable[[str], None] | None = None,
) -> CampaignResult:
    """Run the campaign of the TOML file ``path`` to the end (``name``: its log's; default the file's stem).

    ``on_start`` is called with the name once the campaign's log exists; ``report`` with a line per step.
    """
    config = load_campaign(path, parallel)
    name = check_run_id(name or Path(path).stem)
    if campaign_log(data_dir, name).exists():
        raise InputError(f"campaign {name!r} already exists - choose another --name or --resume it")
    runs = [task_run_id(name, t.name) for t in config.tasks]
    taken = [r for r in runs if EventLog(data_dir, r).exists()]
    if taken:
        raise InputError(
            f"campaign {name!r}: its runs' ids are taken already ({', '.join(taken)}) - choose another --name"
        )
    names, hint = [(CAMPAIGN, name), *((RUN, r) for r in runs)], "choose another --name (its runs are <name>-<task>)"
    for kind, new in names:  # another's name, or one differing only in case
        refuse_clashes(data_dir, kind, new, hint)
    # Every task's snapshots are selected before anything is written: a bad source is refused whole.
    plans = {t.name: plan_task(data_dir, name, config, t) for t in config.tasks}
    # Its name and its runs' claimed before anything is written; all free again if its log gets no event.
    with claimed(data_dir, names, hint), LogWriter.create(campaigns_dir(data_dir), name, CAMPAIGN) as writer:
        started = RunStarted(command="campaign", config=config.model_dump(mode="json"), tool_version=__version__)
        tasks = [
            CampaignTaskAdded(task=t.name, task_run=task_run_id(name, t.name), source=t.source) for t in config.tasks
        ]
        writer.stage([started, *tasks])
        writer.flush()
        if on_start:
            on_start(name)
        catalog = Catalog.empty(CAMPAIGN_VIEWS)
        catalog.load(campaign_log(data_dir, name))
        where = {"executor": executor, "ray_address": ray_address, "report": report or (lambda _: None)}
        drive(data_dir, name, writer, catalog, config, plans=plans, **where)
    return campaign_result(data_dir, name, resumed=False)


def resume_campaign(
    data_dir: Path,
    name: str,
    parallel: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    report: Report | None = None,
) -> CampaignResult:
    """Continue an interrupted campaign from its log (``parallel``: the shared slots from now on)."""
    catalog = open_campaign(data_dir, name)
    config = recorded_campaign(catalog, name)
    finished = catalog.query("select finished from campaign_state")[0]["finished"]
    if not finished:
        with LogWriter.open(campaigns_dir(data_dir), name) as writer:
            note = "resumed from the log" + (f"; parallel {parallel} (recorded {config.parallel})" if parallel else "")
            writer.stage([RunResumed(note=note)])
            writer.flush()
            if parallel is not None:
                config = config.model_copy(update={"parallel": parallel})
            catalog.load(campaign_log(data_dir, name))
            where = {"executor": executor, "ray_address": ray_address, "report": report or (lambda _: None)}
            drive(data_dir, name, writer, catalog, config, **where)
    return campaign_result(data_dir, name, resumed=not finished)


def from_command_line(
    data_dir: Path,
    path: Path | None,
    name: str | None,
    resume: str | None,
    *,
    parallel: int | None,
    executor: str = "local",
    ray_address: str | None = None,
    echo: Report = lambda line: print(line, file=sys.stderr, flush=True),
) -> CampaignResult:
    """The ``campaign`` command: a new campaign of ``path``, or a resume of ``resume``, its lines to ``echo``."""
    from engine.process import continue_with
    from ingest.paths import command_line

    label = resume or name or (Path(path).stem if path else "")

    def report(line: str) -> None:
        echo(f"campaign {label}: {line}")

    def started(created: str) -> None:
        hint = command_line(data_dir, "campaign", "--resume", created)
        echo(f"campaign {created}: running (interrupt and continue with: {hint})")
        continue_with(hint)

    if resume:
        continue_with(command_line(data_dir, "campaign", "--resume", resume))
        return resume_campaign(data_dir, resume, parallel, executor, ray_address, report)
    return new_campaign(
        data_dir,
        path,  # type: ignore[arg-type]
        name,
        parallel=parallel,
        executor=executor,
        ray_address=ray_address,
        report=report,
        on_start=started,
    )


# ---------------------------------------------------------------- reading


def campaign_result(data_dir: Path, name: str, resumed: bool, collection: Collection | None = None) -> CampaignResult:
    """The campaign's state and its summary (per task and in total), read from the logs (the summary from
    ``collection`` when it holds every run of the campaign: a server's, else one of the campaign's runs)."""
    catalog = open_campaign(data_dir, name)
    config = recorded_campaign(catalog, name)
    state = catalog.query("select * from campaign_state")[0]
    runs = campaign_runs(data_dir, name)
    return CampaignResult(
        name, config.policy, resumed, runs, state["rounds"], state["stop_reason"], summary(data_dir, runs, collection)
    )


SUMMARY = "select * from campaign_summary order by run_id"


def summary(data_dir: Path, runs: list[str], collection: Collection | None = None) -> list[dict[str, Any]]:
    """Per task's run: N (selected paths), N_eff, N_eff/N, roots, stages covered, valid edges and tokens (over
    ``collection`` when it holds every run, a row each; else a collection of these runs)."""
    if not runs:
        return []
    if collection is not None and set(runs) <= set(collection.run_ids):
        return collection.query(SUMMARY, tuple(runs))
    from engine.collection import Collection

    return Collection(data_dir, runs).query(SUMMARY)
