"""A campaign's log and what it records: its configuration, its tasks' runs (the views in views/campaign)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.campaign.config import CampaignConfig
from engine.catalog import Catalog
from engine.catalog.definitions import VIEWS_DIR
from ingest.errors import LogError
from ingest.log import EventLog, check_run_id
from ingest.paths import campaigns_dir, under

CAMPAIGN_VIEWS = VIEWS_DIR / "campaign"


def campaign_log(data_dir: Path, name: str) -> EventLog:
    """The log of campaign ``name`` (LogError names it when it does not exist, on ``require``)."""
    return EventLog(campaigns_dir(data_dir), name)


def campaign_names(data_dir: Path) -> list[str]:
    """The campaigns under ``<data>/campaigns``, by name."""
    from ingest.listing import run_ids

    return run_ids(campaigns_dir(data_dir))


def task_run_id(campaign: str, task: str) -> str:
    return check_run_id(f"{campaign}-{task}")


def open_campaign(data_dir: Path, name: str) -> Catalog:
    """A catalog of the campaign's log (views/campaign); LogError when there is no such campaign."""
    log = campaign_log(data_dir, name)
    if not log.exists():
        raise LogError(f"campaign {name!r} not found {under(data_dir, 'campaigns')}")
    catalog = Catalog.empty(CAMPAIGN_VIEWS)
    catalog.load(log)
    return catalog


def recorded_campaign(catalog: Catalog, name: str) -> CampaignConfig:
    """The configuration a campaign's log records (LogError when it is not one this version accepts)."""

    from pydantic import ValidationError

    rows = catalog.query("select config_json from campaign_config")
    if not rows:
        raise LogError(f"campaign {name!r}: its log records no configuration")
    try:
        recorded = json.loads(rows[0]["config_json"])
        if isinstance(recorded, dict) and isinstance(recorded.get("coverage"), dict):
            recorded["coverage"].setdefault("first_pass_probe", False)  # recorded before the probe: run without
        return CampaignConfig.model_validate(recorded)
    except (ValidationError, ValueError) as err:
        raise LogError(f"campaign {name!r}: its recorded configuration is not valid ({err})") from err


def campaign_tasks(catalog: Catalog) -> list[dict[str, str]]:
    """The campaign's tasks (``task``, its run ``task_run``) in the order its file gives them."""
    return catalog.query("select task, task_run from campaign_tasks order by task_order")


def stop_reason(catalog: Catalog) -> str | None:
    """Why the campaign stopped (``campaign_state``), or None while it has not."""
    return catalog.query("select stop_reason from campaign_state")[0]["stop_reason"]


def campaign_runs(data_dir: Path, name: str) -> list[str]:
    """The runs of campaign ``name``, in its tasks' order (those created so far)."""
    runs = [r["task_run"] for r in campaign_tasks(open_campaign(data_dir, name))]
    return [r for r in runs if EventLog(data_dir, r).exists()]
