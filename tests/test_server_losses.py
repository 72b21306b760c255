"""How many turns one ``opencode serve`` carries (sized by the machine), and a lost server counted once
in the streak of backend errors (``int_turns__failing``)."""

from __future__ import annotations

from facts import catalog, root, start, turn

from engine.teachers.opencode.options import MAX_WIDTH, OpenCodeOptions, machine_cores, resolve_options, sized_width
from ingest.events import TurnFinished


def test_the_default_width_spreads_the_runs_turns_over_one_server_a_core():
    # (a server is one event loop: 16 turns on one left the second core of two idle)
    assert sized_width(16, cores=2) == 8 and sized_width(4, cores=2) == 2 and sized_width(15, cores=2) == 8
    assert sized_width(1, cores=8) == 1 and sized_width(16, cores=1) == 16
    assert sized_width(64, cores=2) == MAX_WIDTH == 16  # no server given more than 16 at once
    assert sized_width(16) == sized_width(16, cores=machine_cores())


def test_an_explicit_width_wins_and_the_default_is_recorded_as_unset():
    assert sized_width(64, 4, cores=2) == 4 and sized_width(4, 32, cores=2) == 32
    # (what is recorded is the setting, not this machine's size: a log stays a function of its settings)
    assert resolve_options({"model": "p/m"})["server_width"] is None
    assert resolve_options({"model": "p/m", "server_width": 3})["server_width"] == 3
    assert OpenCodeOptions.model_validate({"model": "p/m", "server_width": 16}).server_width == 16


def _failed(edge_id: str, lost: str | None) -> list:
    facts = turn(edge_id, 1, None, outcome="error")
    done = facts[-1]
    assert isinstance(done, TurnFinished)
    return [start(edge_id, "T1"), *facts[:-1], done.model_copy(update={"lost_server": lost})]


def _failing(events: list) -> dict:
    return catalog(events).query("select streak, turns from int_turns__failing")[0]


def test_the_turns_one_lost_server_carried_count_once_in_the_streak():
    lost = [e for k in range(1, 5) for e in _failed(f"T1/e{k}-1", "4242-abc")]
    assert _failing([root(), *lost]) == {"streak": 1, "turns": 4}
    # another server's loss, and a turn that failed on its own, count one each
    more = _failed("T1/e5-1", "4343-def") + _failed("T1/e6-1", None) + _failed("T1/e7-1", "4242-abc")
    assert _failing([root(), *lost, *more]) == {"streak": 3, "turns": 7}
    # a turn that did not fail ends the streak
    assert _failing([root(), *lost, *turn("T1/e8-1", 1, 1.0), *_failed("T1/e9-1", "4242-abc")])["streak"] == 1


def test_a_log_from_before_lost_server_counts_every_failed_turn():
    old = [e for k in range(1, 5) for e in _failed(f"T1/e{k}-1", None)]
    assert _failing([root(), *old]) == {"streak": 4, "turns": 4}
