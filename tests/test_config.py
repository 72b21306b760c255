"""Run configuration: defaults that depend on the backend, and the bounds of weights."""

from __future__ import annotations

import pytest

from engine.config import MAX_WEIGHT, PathWeights, RunConfig, load_config
from ingest.errors import InputError


def test_the_schedule_defaults_to_rounds_for_the_sim_and_async_for_real_teachers():
    """A real Teacher's turns take seconds to the timeout: a batch barrier idles its slots."""
    assert RunConfig().schedule == "rounds"
    assert RunConfig(backend="opencode").schedule == "async"
    assert RunConfig(backend="opencode", schedule="rounds").schedule == "rounds"
    assert load_config(None, {"backend": "opencode"}).schedule == "async"
    # Recorded resolved: a resumed run keeps the schedule it had.
    assert RunConfig.model_validate(RunConfig(backend="opencode").model_dump(mode="json")).schedule == "async"


@pytest.mark.parametrize(
    ("section", "key"), [("paths", "max"), ("soft", "outcome_improved"), ("q", "process"), ("soft", "cleanliness")]
)
def test_weights_and_levels_are_bounded_and_may_be_negative(section, key):
    assert load_config(None, {section: {key: -MAX_WEIGHT}})
    with pytest.raises(InputError, match=rf"{section}\.{key}: Value error, must be between"):
        load_config(None, {section: {key: MAX_WEIGHT * 10}})


def test_all_zero_path_weights_are_refused_and_one_nonzero_is_enough():
    with pytest.raises(ValueError, match="every path would score 0"):
        PathWeights(max=0, avg=0, clean=0, know=0)
    assert PathWeights(max=0, avg=0, clean=0, know=-1).know == -1


def test_the_backend_error_limit_is_at_least_one():
    assert RunConfig().backend_error_limit == 3
    with pytest.raises(InputError, match="backend_error_limit"):
        load_config(None, {"backend_error_limit": 0})


def test_lookahead_is_auto_or_a_count_of_at_least_zero():
    assert RunConfig().lookahead == "auto" and RunConfig(lookahead=0).lookahead == 0
    for bad in (-1, "some"):
        with pytest.raises(InputError, match="lookahead"):
            load_config(None, {"lookahead": bad})
