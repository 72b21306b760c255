"""Names as file systems see them: a run and a campaign never share a name, and no two names differ only in case.

A name on the command line stands for a run or a campaign (``engine.runset`` resolves it),
and each names a directory: ``<data>/runs/<name>`` or ``<data>/campaigns/runs/<name>``.
A run named after a campaign would hide it from every command that takes the name, and on
a case-insensitive file system (macOS, Windows) ``y-t1`` and ``y-T1`` are one directory.
So a new run or campaign is refused when a directory of either place already has its name,
or one equal to it ignoring case and Unicode normalisation (:func:`folded`); its own name
in its own place is left to the creator (a run with events is refused by
``LogWriter.create``, the empty directory of a start that failed is taken again). A start
that fails before its first event removes the directories it made (:func:`claimed`); one
a killed start left is named in the refusal as holding no log.

Creating is claiming (:func:`claim`): the check and the directory's ``mkdir`` are one step
under an exclusive ``flock`` of the data directory itself, so of two processes creating
``x`` and ``X`` at once exactly one succeeds. The lock is held for a listing and a mkdir,
never while a run is written, and dies with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from ingest.errors import InputError
from ingest.listing import being_written, has_log
from ingest.paths import CAMPAIGNS

RUN, CAMPAIGN = "run", "campaign"
Clash = tuple[str, str, Path]  # (the other's kind, its name, its directory)


def folded(name: str) -> str:
    """``name`` as names are compared: NFKC-normalised and case-folded (Unicode's NFKC_Casefold, near enough)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def place(data_dir: Path | str, kind: str) -> Path:
    """Where the directories of ``kind`` (runs, campaigns) lie under the data directory."""
    return Path(data_dir) / CAMPAIGNS / "runs" if kind == CAMPAIGN else Path(data_dir) / "runs"


def clashes(data_dir: Path | str, kind: str, name: str) -> list[Clash]:
    """The runs' and campaigns' directories under ``data_dir`` whose names a new ``kind`` named ``name`` would
    clash with: equal to it ignoring case and normalisation, but for ``name`` itself in its own place."""
    key, found = folded(name), []
    for other in (RUN, CAMPAIGN):
        where = place(data_dir, other)
        try:
            entries = sorted(os.listdir(where))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if not entry.startswith(".") and folded(entry) == key and (other, entry) != (kind, name):
                found.append((other, entry, where / entry))
    return found


def clash_message(kind: str, name: str, clash: Clash, hint: str) -> str:
    """What is wrong with the new name, where the other lies, and what to do."""
    other, other_name, path = clash
    if other_name == name:
        why = (
            f"{kind} name {name!r} is taken by the {other} {name!r} ({path}): a name on the command line stands "
            "for a run or a campaign, so the two cannot share one"
        )
    else:
        how = "in case" if name.lower() == other_name.lower() else "in case or Unicode form"
        why = (
            f"{kind} name {name!r} differs only {how} from the {other} {other_name!r} ({path}): on a "
            "case-insensitive file system the two are one directory"
        )
    if not has_log(path / "log", other_name):
        why += " - that directory holds no log (a start that failed?); remove it if nothing in it is needed, or"
    else:
        why += " -"
    return f"{why} {hint}"


def refuse_clashes(data_dir: Path | str, kind: str, name: str, hint: str = "choose another name") -> None:
    """InputError when a new ``kind`` named ``name`` would clash with a run or campaign under ``data_dir``."""
    found = clashes(data_dir, kind, name)
    if found:
        raise InputError(clash_message(kind, name, found[0], hint))


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """An exclusive ``flock`` of the data directory (made if need be): one creator of names at a time."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def claim(data_dir: Path | str, wanted: list[tuple[str, str]], hint: str = "choose another name") -> list[Path]:
    """Make the directories of the new runs and campaigns ``wanted`` (``(kind, name)`` pairs) under the data
    directory's lock, once none clashes with another's name (InputError, nothing made) nor with one another;
    the directories made now (one that existed already is the creator's to judge)."""
    data = Path(data_dir)
    keys = [folded(name) for _, name in wanted]
    twice = next(((k, n) for (k, n), key in zip(wanted, keys, strict=True) if keys.count(key) > 1), None)
    if twice is not None:
        kind, name = twice
        raise InputError(f"{kind} name {name!r} is given twice, ignoring case - {hint}")
    with _locked(data):
        for kind, name in wanted:
            refuse_clashes(data, kind, name, hint)
        made = []
        for kind, name in wanted:
            path = place(data, kind) / name
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                continue
            made.append(path)
        return made


@contextlib.contextmanager
def claimed(data_dir: Path | str, wanted: list[tuple[str, str]], hint: str = "choose another name") -> Iterator[None]:
    """:func:`claim` ``wanted`` for the block: if it fails before the first of them (the one created, whose
    other names are its own: a campaign's runs) has an event in its log, the directories made are removed again,
    so a start that failed leaves no directory whose name would stand in another's way."""
    made = claim(data_dir, wanted, hint)
    try:
        yield
    except BaseException:
        kind, name = wanted[0]
        if not has_log(place(data_dir, kind) / name / "log", name):
            release(data_dir, made)
        raise


def release(data_dir: Path | str, made: list[Path]) -> None:
    """Remove the directories :func:`claim` made for a creation that failed before its log had an event (a
    directory whose log has one, or that another process writes under the same name, is left as it is)."""
    with _locked(Path(data_dir)):
        for path in made:
            if not has_log(path / "log", path.name) and not being_written(path):
                shutil.rmtree(path, ignore_errors=True)
