"""The coverage policy's rounds (engine.campaign.policy.decide) on hand-built view rows.

A first pass under a token budget spent 121.5M tokens of a 40M budget in its one blind
round (docs/CAMPAIGNS.md's example): with ``first_pass_probe`` it opens one root a task
first, then as many of the others as the tokens left pay for at the cost seen. A log
recorded before the probe existed is decided as it was.
"""

from __future__ import annotations

from datetime import UTC, datetime

from engine.campaign.config import CampaignConfig
from engine.campaign.log import recorded_campaign
from engine.campaign.policy import TaskRows, decide
from engine.catalog import Catalog
from engine.runset import CAMPAIGN_VIEWS
from ingest.events import RunStarted
from ingest.schema import to_arrow


def config(tokens: int | None = None, edges: int | None = None, **coverage) -> CampaignConfig:
    budget = {k: v for k, v in (("tokens", tokens), ("edges", edges)) if v is not None}
    tasks = [{"name": t, "source": "s"} for t in ("a", "b")]
    return CampaignConfig.model_validate(
        {"policy": "coverage", "budget": budget, "coverage": {"first_pass_edges": 2, "block_edges": 4, **coverage}}
        | {"tasks": tasks}
    )


def rows(task: str, trees: int, opened: dict[str, int] | None = None, per_edge: float | None = None) -> TaskRows:
    """A task's gains rows: ``opened`` trees (tree id -> edges granted) spent ``per_edge`` tokens an edge."""
    opened = opened or {}
    gains = [
        {
            "tree_id": f"T{i:03d}",
            "eligible": True,
            "granted_edges": opened.get(f"T{i:03d}", 0),
            "expected_tokens": None if per_edge is None else 4 * per_edge,  # a block of block_edges
            "gain": None if per_edge is None else 1.0 / i,
        }
        for i in range(1, trees + 1)
    ]
    spent = sum(opened.values())
    spend = {"kept_edges": spent, "tokens": int(spent * (per_edge or 0))}
    return TaskRows(task, f"c-{task}", gains, spend)


def grants(decided) -> list[tuple[str, str, int]]:
    return [(g["task"], g["tree_id"], g["edges"]) for g in decided.grants]


def test_without_a_token_budget_the_first_pass_is_one_round_of_every_root():
    decided = decide(config(edges=100), 0, [rows("a", 3), rows("b", 2)])
    assert decided.rule == "first_pass"
    assert grants(decided) == [("a", f"T00{i}", 2) for i in (1, 2, 3)] + [("b", f"T00{i}", 2) for i in (1, 2)]


def test_under_a_token_budget_the_first_pass_probes_one_root_a_task_then_opens_what_the_tokens_pay_for():
    cfg = config(tokens=10_000)
    first = decide(cfg, 0, [rows("a", 3), rows("b", 2)])
    assert (first.rule, grants(first)) == ("first_pass", [("a", "T001", 2), ("b", "T001", 2)])
    # 2 edges a root spent: task a 1,000 tokens an edge, b 1,500; 5,000 spent, 5,000 left
    seen = [rows("a", 3, {"T001": 2}, 1000.0), rows("b", 2, {"T001": 2}, 1500.0)]
    second = decide(cfg, 1, seen)
    # the second root of every task before the third: a/T002 (2,000), b/T002 (3,000); a/T003 would overrun
    assert (second.rule, grants(second)) == ("first_pass", [("a", "T002", 2), ("b", "T002", 2)])
    assert decide(cfg, 2, seen).rule == "coverage"  # then blocks by gain, as before


def test_the_probes_second_round_gives_its_first_block_even_when_it_does_not_fit():
    seen = [rows("a", 3, {"T001": 2}, 1000.0), rows("b", 2, {"T001": 2}, 1000.0)]
    decided = decide(config(tokens=4_500), 1, seen)  # 500 left: one block of 2,000 overruns, as a round may
    assert grants(decided) == [("a", "T002", 2)]


def test_a_probe_round_after_the_first_pass_is_a_coverage_round():
    seen = [rows("a", 1, {"T001": 2}, 1000.0), rows("b", 1, {"T001": 2}, 1000.0)]  # one root a task: all opened
    assert decide(config(tokens=100_000), 1, seen).rule == "coverage"


def test_a_log_recorded_before_the_probe_is_decided_without_it():
    recorded = config(tokens=10_000).model_dump(mode="json")
    assert recorded["coverage"]["first_pass_probe"] is True  # a new campaign records it
    del recorded["coverage"]["first_pass_probe"]
    campaign = Catalog.empty(CAMPAIGN_VIEWS)
    campaign.insert(to_arrow([RunStarted(command="campaign", config=recorded)], "c", 1, datetime.now(UTC)))
    old = recorded_campaign(campaign, "c")
    assert old.coverage.first_pass_probe is False
    assert len(decide(old, 0, [rows("a", 3), rows("b", 2)]).grants) == 5  # every root, as it was decided
