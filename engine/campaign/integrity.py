"""``verify`` and ``quarantine`` of a campaign: its own log and each of its task runs' logs.

A campaign's name stands for its logs here as it stands for its runs elsewhere: its own,
``<data>/campaigns/runs/<name>/log``, and its runs' under ``<data>/runs``, each checked
as ``verify RUN`` checks a run's (``ingest.integrity``). Its runs are the ones its log
records, read from the parts that verified, so a damaged log still names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.runset import Reader, campaign_log, is_campaign
from ingest.errors import InputError, LogError
from ingest.integrity import Quarantined, Verification, quarantine, verify_log
from ingest.log import EventLog
from ingest.paths import command_line

ADDED = "campaign_task_added"  # the kind of a CampaignTaskAdded event in the log


@dataclass
class CampaignVerification:
    """What ``verify NAME`` found: the campaign's own log, then each of its runs' in its tasks' order."""

    name: str
    log: Verification
    runs: list[Verification]
    tasks_read: bool  # False: the part recording its tasks is damaged, its runs are not known

    @property
    def ok(self) -> bool:
        return self.log.ok and all(v.ok for v in self.runs)


def verify_named(data_dir: Path, name: str) -> Verification | CampaignVerification:
    """``verify NAME``: the log of run ``name``, or every log of campaign ``name`` (a run of that name first)."""
    if is_campaign(data_dir, name):
        return verify_campaign(data_dir, name)
    return verify_log(EventLog(data_dir, name))


def derived_states(reader: Reader, found: Verification | CampaignVerification) -> dict[str, list]:
    """The stored derived state of each run ``verify`` checked (:meth:`engine.derived.Derived.inspect`), read
    through ``reader`` (the command's)."""
    derived = reader.derived
    runs = found.runs if isinstance(found, CampaignVerification) else [found]
    return {v.run_id: derived.inspect(v.run_id) for v in runs}


def verify_campaign(data_dir: Path, name: str) -> CampaignVerification:
    """Check every byte of campaign ``name``'s log and of each of its runs' logs (those created so far)."""
    found = verify_log(campaign_log(data_dir, name))
    runs = recorded_runs(found)
    logs = [EventLog(data_dir, r) for r in runs or []]
    return CampaignVerification(name, found, [verify_log(log) for log in logs if log.exists()], runs is not None)


def recorded_runs(found: Verification) -> list[str] | None:
    """The task runs a campaign's log records (``CampaignTaskAdded``), in order, from the parts that are
    not damaged (None: the part holding its first events is, and with them its tasks)."""
    runs: list[str] = []
    started = False
    for part in found.parts:
        if part.problem is not None:
            continue
        try:
            table = pq.read_table(part.path)
        except (pa.ArrowException, OSError):
            continue
        started = started or part.first == 1
        if "task_run" in table.column_names:
            runs += [r["task_run"] for r in table.select(["kind", "task_run"]).to_pylist() if r["kind"] == ADDED]
    return list(dict.fromkeys(runs)) if started else None


def quarantine_named(data_dir: Path, name: str, part: str) -> tuple[Quarantined, str]:
    """``quarantine NAME PART``: in the log of run ``name``, or in the log of campaign ``name`` that names
    ``part``; with whose log that was (``run`` or ``campaign``)."""
    if not is_campaign(data_dir, name):
        return quarantine(EventLog(data_dir, name), part), "run"
    done, own = quarantine_campaign(data_dir, name, part)
    return done, "campaign" if own else "run"


def quarantine_campaign(data_dir: Path, name: str, part: str) -> tuple[Quarantined, bool]:
    """Quarantine ``part`` in the log of campaign ``name`` that names it: its own or one of its runs'.

    ``part`` is a file name (or a path, which says the log by its directory). A name that
    several logs hold (each has a record) is the one in the log that does not verify.
    Returns what was moved and whether it was the campaign's own log.
    """
    own = campaign_log(data_dir, name)
    logs = [own, *(EventLog(data_dir, r) for r in recorded_runs(verify_log(own)) or [])]
    logs = [log for log in logs if log.exists()]
    given = Path(part)
    if given.name in ("", ".", ".."):
        raise InputError(f"{part!r} names no file of a log - '{command_line(data_dir, 'verify', name)}' lists them")
    if given.parent != Path("."):
        named = [log for log in logs if log.log_dir.resolve() == given.parent.resolve()]
    else:
        named = [log for log in logs if _names(log, given.name)]
    if len(named) > 1:
        damaged = [log for log in named if not verify_log(log).ok]
        if not damaged:
            raise InputError(
                f"campaign {name!r}: {given.name} is in {len(named)} of its logs and each verifies - nothing to move"
            )
        named = damaged
    if not named:
        raise InputError(
            f"campaign {name!r}: none of its logs names {given.name!r} - "
            f"'{command_line(data_dir, 'verify', name)}' lists every log's parts"
        )
    if len(named) > 1:
        paths = ", ".join(str(log.log_dir / given.name) for log in named)
        raise InputError(
            f"campaign {name!r}: {given.name} is damaged in {len(named)} of its logs ({paths}) - "
            "name the one to move by its path; nothing was moved"
        )
    return quarantine(named[0], part), named[0] is own


def _names(log: EventLog, name: str) -> bool:
    """Whether ``log`` holds a file ``name`` (a part, its record, a file copied in) or its record names it."""
    if (log.log_dir / name).exists():
        return True
    try:
        record = log.record()
    except LogError:
        return False
    return record is not None and name in record.live
