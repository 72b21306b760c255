"""What a campaign's log records: its configuration, its stop (the views in views/campaign; the log itself, its
tasks and their runs are read where a campaign's name is resolved: ``engine.runset``)."""

from __future__ import annotations

import json

from engine.campaign.config import CampaignConfig
from engine.catalog import Catalog
from ingest.errors import LogError
from ingest.log import check_run_id


def task_run_id(campaign: str, task: str) -> str:
    return check_run_id(f"{campaign}-{task}")


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


def stop_reason(catalog: Catalog) -> str | None:
    """Why the campaign stopped (``campaign_state``), or None while it has not."""
    return catalog.query("select stop_reason from campaign_state")[0]["stop_reason"]
