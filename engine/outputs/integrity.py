"""What ``verify`` and ``quarantine`` print: a log's parts, its damage and its fix; a run's stored derived state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.render import Output, table
from ingest.paths import command_line

Row = dict[str, Any]


def part_row(c: Any) -> Row:
    return {
        "part": c.name,
        "first": c.first,
        "last": c.last,
        "level": c.level,
        "checksum": c.checksum,
        "problem": c.problem,
    }


def verification(found: Any, data_dir: Path, what: str = "run", derived: list[Any] | None = None) -> Output:
    """verify: a row per part, what a crash or an old version left, the first damage and its fix; and
    ``derived``: the run's stored states (:meth:`engine.derived.Derived.inspect`), what a reader would drop."""
    document = {
        "run_id": found.run_id,
        "ok": found.ok,
        "intact_to": found.intact_to,
        "tail": found.tail,
        "problem": found.problem,
        "first_bad": found.first_bad and found.first_bad.name,
        "first_bad_path": found.first_bad and str(found.first_bad.path),
        "parts": [part_row(c) for c in found.parts],
        "superseded": [c.name for c in found.superseded],
        "temporary": found.temporary,
        "foreign": found.foreign,
        "recorded": found.recorded,
    }
    lines = _verification_lines(found, data_dir, what)
    if derived is not None:
        document["derived"] = [
            {
                "state": str(d.path),
                "current": d.current,
                "variables": d.variables,
                "files": d.files,
                "problems": d.problems,
                "other": d.other,
            }
            for d in derived
        ]
        verdict = next(i for i, line in enumerate(lines) if line.startswith("verify: "))
        lines[verdict:verdict] = _derived_lines(found.run_id, derived)  # (the log's verdict stays last)
    return Output(document, lines)


def _derived_lines(run_id: str, derived: list[Any]) -> list[str]:
    """The run's stored derived state: how many states, which are damaged (a reader drops those)."""
    if not derived:
        return [f"derived state of run {run_id}: none stored (the next read derives it from the log)"]
    damaged = [d for d in derived if d.problems]
    current = sum(d.current for d in derived)
    other = sum(d.other is not None for d in derived)
    searchable = ", serve's search text among them" if any(d.path.name == "transcripts" for d in derived) else ""
    head = f"derived state of run {run_id}: {len(derived)} stored{searchable} ({current} of the log as it is now"
    head += (
        f", {other} derived by an earlier version or other views: never read, removed by the next read)"
        if other
        else ")"
    )
    if not damaged:
        return [f"{head}; every file as its digest records, under this user's key"]
    lines = [
        f"{head}; {len(damaged)} damaged or not made by this user - the next read drops each and derives it again "
        "from the log:"
    ]
    return lines + [f"  DAMAGED  {d.path}: {'; '.join(d.problems)}" for d in damaged]


def _verification_lines(found: Any, data_dir: Path, what: str) -> list[str]:
    rows = [
        {"status": "DAMAGED" if c.problem else "ok", "seqs": f"{c.first}..{c.last}", **part_row(c)} for c in found.parts
    ]
    lines = [
        f"{what} {found.run_id}: {len(found.parts)} parts, seqs 1..{found.tail}",
        table(rows, ["status", "part", "seqs", "level", "problem"]),
    ]
    if found.unchecksummed:
        lines.append(
            f"{found.unchecksummed} part(s) carry no checksum (written before checksums): their pages "
            "decode and their seqs are whole, a changed value cannot be seen; the writer gives them "
            "one when it next opens the run"
        )
    if not found.recorded:
        lines.append(
            "the run has no record of its parts (written before records): its log is the cover of its "
            "part files; the writer records them when it next opens the run"
        )
    if found.superseded or found.temporary:
        lines.append(
            f"a crash left {len(found.superseded)} superseded part(s) and {len(found.temporary)} temp "
            "file(s); the writer removes them when it next opens the run"
        )
    lines += [
        f"FOREIGN  {found.log_dir / name}: not a part the run's record names (nothing reads it; the writer "
        f"refuses to append until it is moved aside: {command_line(data_dir, 'quarantine', found.run_id, name)})"
        for name in found.foreign
    ]
    if found.ok:
        return [
            *lines,
            f"verify: {len(found.parts)} parts, {found.tail} events: every checksum matches, every "
            "page decodes, every seq is there once",
        ]
    lines.append(f"verify: the log is intact up to seq {found.intact_to} of {found.tail}; {found.problem}")
    if found.first_bad is not None:
        lines += [
            f"first bad part: {found.first_bad.path} ({found.first_bad.seqs})",
            f"nothing is appended to the {what} until that part and the ones after it are moved aside: "
            f"{command_line(data_dir, 'quarantine', found.run_id, found.first_bad.name)}",
        ]
    return lines


def verified(found: Any, data_dir: Path, derived: dict[str, list[Any]]) -> Output:
    """verify of a run (``verification``) or of a campaign (``campaign_verification``), with ``derived``:
    each run's stored states."""
    if hasattr(found, "runs"):
        return campaign_verification(found, data_dir, derived)
    return verification(found, data_dir, derived=derived.get(found.run_id))


def campaign_verification(found: Any, data_dir: Path, derived: dict[str, list[Any]] | None = None) -> Output:
    """verify of a campaign: a section per log (its own, then each run's, as ``verification`` prints it), a total."""
    derived = derived or {}
    shown = {("campaign", found.log.run_id): verification(found.log, data_dir, "campaign")}
    shown |= {("run", v.run_id): verification(v, data_dir, derived=derived.get(v.run_id)) for v in found.runs}
    damaged = [f"{kind} {name}" for (kind, name), s in shown.items() if not s.document["ok"]]
    total = f"its log and {len(found.runs)} run(s) verify"
    total = f"{len(damaged)} of {len(shown)} logs damaged ({', '.join(damaged)})" if damaged else total
    total += "" if found.tasks_read else "; its tasks are in a damaged part: its runs were not verified"
    lines = [line for s in shown.values() for line in (*s.lines, "")] + [f"verify campaign {found.name}: {total}"]
    document = {"campaign": found.name, "ok": found.ok, "damaged": damaged, "tasks_read": found.tasks_read}
    return Output({**document, "logs": [{"log": kind, **s.document} for (kind, _), s in shown.items()]}, lines)


def quarantined(done: Any, run_id: str, data_dir: Path, what: str = "run") -> Output:
    """quarantine: what was moved where, and what the log holds now (``what``: a run's log or a campaign's)."""
    document = {
        "run_id": run_id,
        "moved": [part_row(c) for c in done.moved],
        "destination": str(done.destination),
        "intact_to": done.intact_to,
        "events_moved": done.events_moved,
        "turns_moved": done.turns_moved,
        "finished_moved": done.finished_moved,
        "spool_moved": done.spool_moved and str(done.spool_moved),
        "foreign": done.foreign,
    }
    return Output(document, _quarantine_lines(done, run_id, data_dir, what))


def _quarantine_lines(done: Any, run_id: str, data_dir: Path, what: str) -> list[str]:
    if done.foreign:
        return [
            f"{what} {run_id}: moved {done.moved[0].name} to {done.destination} ({done.moved[0].problem}); "
            f"the log is unchanged, seqs 1..{done.intact_to}"
        ]
    lines = [f"{what} {run_id}: moved {len(done.moved)} part(s) to {done.destination}:"]
    lines += [f"  {c.name} (seqs {c.first}..{c.last})" + (f": {c.problem}" if c.problem else "") for c in done.moved]
    if done.spool_moved:
        lines.append(f"  and the spool of finished turns (they followed the old tail): {done.spool_moved}")
    if done.intact_to == 0:
        return [
            *lines,
            f"the log holds no event now (its first part was damaged): nothing can be resumed - start the {what} again",
        ]
    turns = "an unknown number of" if done.turns_moved is None else str(done.turns_moved)
    ended = f", and the {what}'s RunFinished" if done.finished_moved else ""
    command, again = ("campaign", "decides those rounds") if what == "campaign" else ("explore", "runs those turns")
    return [
        *lines,
        f"the log now holds seqs 1..{done.intact_to}, intact ({done.events_moved} events moved: "
        f"{turns} finished turns{ended})",
        f"{'the campaign' if what == 'campaign' else 'an exploration'} continues with: "
        f"{command_line(data_dir, command, '--resume', run_id)} (it {again} again)",
    ]
