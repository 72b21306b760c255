"""Campaign names where commands take run ids: a campaign named stands for its runs (light: no DuckDB until one is)."""

from __future__ import annotations

from pathlib import Path

from ingest.listing import has_log
from ingest.paths import RUN_ID_RE, campaigns_dir, run_dir


def is_campaign(data_dir: Path | str, name: str) -> bool:
    """Whether ``name`` is a campaign under ``data_dir`` and not a run (a run of that name comes first)."""
    if not RUN_ID_RE.match(name) or ".." in name:
        return False
    if has_log(run_dir(data_dir, name) / "log", name):
        return False
    return has_log(run_dir(campaigns_dir(data_dir), name) / "log", name)


def expand(data_dir: Path | str, names: list[str]) -> list[str]:
    """``names`` with each campaign's name replaced by its runs (in its tasks' order), each run once."""
    out: list[str] = []
    for name in names:
        if is_campaign(data_dir, name):
            from engine.campaign.log import campaign_runs

            out.extend(campaign_runs(Path(data_dir), name))
        else:
            out.append(name)
    return list(dict.fromkeys(out))
