"""Replaying a campaign: re-derive every round's grants (and its stop) from the runs' logs.

Each decision recorded in the campaign's log names the tail of every run it read
(``marks``). Replay loads each run's log up to those seqs, round after round (one
catalog a run, caught up from one mark to the next), reads ``campaign_gains`` and
``campaign_spend`` there, and asks the policy (:func:`engine.campaign.policy.decide`)
what it gives: every recorded grant, edge count and gain must be what it derives, and
every run must hold exactly the grants the campaign recorded for it (and their close
once the campaign stopped). Each run's own decisions are replayed as any run's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.campaign.log import recorded_campaign, stop_reason
from engine.campaign.policy import TaskRows, decide
from engine.catalog import Catalog
from engine.replay import Difference, ReplayResult, replay_runs
from engine.runs import run_finished
from engine.runset import campaign_tasks, open_campaign
from ingest.log import EventLog

GAIN_TOLERANCE = 1e-9  # as the views' differs(): float noise between two evaluations


@dataclass
class CampaignReplay:
    """The campaign's decisions checked, and its runs' replays."""

    name: str
    decisions: int
    differences: list[Difference] = field(default_factory=list)
    runs: list[ReplayResult] = field(default_factory=list)


def _key(grant: dict[str, Any]) -> tuple:
    return (grant["task"], grant["run"], grant["tree_id"], int(grant["edges"]))


def _gains_differ(recorded: dict[str, Any], derived: dict[str, Any]) -> bool:
    a, b = recorded.get("gain"), derived.get("gain")
    if a is None or b is None:
        return (a is None) != (b is None)
    return a != b and abs(a - b) > GAIN_TOLERANCE


def replay_campaign(data_dir: Path, name: str) -> CampaignReplay:
    """Re-derive every decision of campaign ``name`` (and replay each of its runs)."""
    catalog = open_campaign(data_dir, name)
    config = recorded_campaign(catalog, name)
    tasks = campaign_tasks(catalog)
    decisions = catalog.query("select * from campaign_rounds order by seq")
    result = CampaignReplay(name, len(decisions))
    runs = {t["task_run"]: Catalog.empty() for t in tasks}
    logs = {t["task_run"]: EventLog(data_dir, t["task_run"]) for t in tasks}
    loaded = dict.fromkeys(runs, 0)

    def differ(seq: int, subject: str, problem: str, recorded: Any, derived: Any) -> None:
        kind = "campaign_stopped" if decision["rule"] == "stop" else "budget_allocated"
        result.differences.append(Difference(seq, kind, None, subject, problem, recorded, derived))

    for decision in decisions:
        seq, marks = decision["seq"], json.loads(decision["marks"])
        missing = [t["task_run"] for t in tasks if t["task_run"] not in marks]
        if missing:
            differ(seq, f"round {decision['round']}", "a run's tail was not read", None, ", ".join(missing))
            continue
        rows = []
        for task in tasks:
            run, mark = task["task_run"], int(marks[task["task_run"]])
            if mark < loaded[run]:
                differ(seq, run, "the run's tail went back", str(mark), f">= {loaded[run]}")
            runs[run].load(logs[run], upto=mark)
            loaded[run] = max(loaded[run], mark)
            gains = runs[run].query("select * from campaign_gains order by tree_id")
            spend = runs[run].query("select * from campaign_spend")[0]
            rows.append(TaskRows(task["task"], run, gains, spend))
        derived = decide(config, decision["round"], rows)
        if decision["rule"] == "stop" or derived.stop is not None:
            if decision["rule"] != "stop" or decision["reason"] != derived.stop:
                shown = "grants" if decision["rule"] != "stop" else f"stop ({decision['reason']})"
                derived_shown = f"stop ({derived.stop})" if derived.stop else f"{len(derived.grants)} grants"
                differ(seq, f"round {decision['round']}", "the round differs", shown, derived_shown)
            continue
        recorded = json.loads(decision["grants"])
        if decision["rule"] != derived.rule:
            differ(seq, f"round {decision['round']}", "rule differs", decision["rule"], derived.rule)
        if [_key(g) for g in recorded] != [_key(g) for g in derived.grants]:
            shown = lambda gs: "; ".join(f"{g['run']}:{g['tree_id']}+{g['edges']}" for g in gs)  # noqa: E731
            differ(seq, f"round {decision['round']}", "grants differ", shown(recorded), shown(derived.grants))
            continue
        for r, d in zip(recorded, derived.grants, strict=True):
            if _gains_differ(r, d):
                differ(seq, f"{r['run']}:{r['tree_id']}", "gain differs", str(r.get("gain")), str(d.get("gain")))
    _check_copies(catalog, runs, logs, result)
    result.runs = list(replay_runs(data_dir, [t["task_run"] for t in tasks if logs[t["task_run"]].exists()]))
    return result


def _check_copies(
    catalog: Catalog, runs: dict[str, Catalog], logs: dict[str, EventLog], result: CampaignReplay
) -> None:
    """Every run holds exactly the grants the campaign recorded for it, and their close once it stopped."""
    grants = catalog.query("select task_run, round, tree_id, edges from campaign_grants")
    stopped = stop_reason(catalog) is not None
    for run, run_catalog in runs.items():
        if not logs[run].exists():
            continue
        run_catalog.load(logs[run])
        recorded = sorted((g["round"], g["tree_id"], g["edges"]) for g in grants if g["task_run"] == run)
        held = sorted(
            (r["round"], r["tree_id"], r["edges"]) for r in run_catalog.query("select * from stg_block_granted")
        )
        if recorded != held:
            extra = sorted(set(held) - set(recorded))
            lost = sorted(set(recorded) - set(held))
            result.differences.append(
                Difference(
                    None,
                    "block_granted",
                    None,
                    run,
                    "the run's grants differ from the campaign's",
                    f"{len(recorded)} granted ({len(lost)} not in the run)",
                    f"{len(held)} held ({len(extra)} not granted)",
                )
            )
        finished = run_finished(run_catalog)
        closed = bool(run_catalog.query("select 1 from stg_grants_closed"))
        granted = run_catalog.query("select granted from run_config")[0]["granted"]
        if granted and closed and not stopped:
            result.differences.append(
                Difference(
                    None, "grants_closed", None, run, "grants closed, the campaign did not stop", "closed", "open"
                )
            )
        if granted and finished and not closed:
            result.differences.append(
                Difference(None, "grants_closed", None, run, "the run finished with its grants open", "open", "closed")
            )
