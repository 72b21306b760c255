"""The project's error hierarchy; the CLI turns every ProjectError into a clean message."""

from __future__ import annotations

import re
import shutil


class ProjectError(Exception):
    """Base of every error the project raises on purpose."""


class InputError(ValueError, ProjectError):
    """Input files or arguments that cannot be used as given."""


class OptionError(InputError):
    """A command-line option's value that no run could use: the CLI makes it a usage error (exit 2).

    Raised where the value is checked (a library call validating what the CLI passes
    on); ``option`` names it. Bad content of files and logs stays an InputError (exit 1).
    """

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


class LogError(ProjectError):
    """The event log is missing, locked or inconsistent."""


class SeqConflictError(LogError):
    """An append expected a different tail sequence number."""


class WriterLockedError(LogError):
    """Another process is already writing this run."""


class PartDamagedError(LogError):
    """A part of the log is not what was published: its checksum, pages or seqs disagree."""


class ViewBuildError(ProjectError):
    """A view in views/ could not be created."""


class OutputError(ProjectError):
    """The machine refused to write an output (a full disk, a quota, permissions)."""


def os_problem(err: OSError) -> str:
    """An OS error as ``<file>: <reason>`` (the first of a failed tree copy's)."""
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        _src, dst, why = err.args[0][0]  # why: "[Errno 28] No space left on device: 'a' -> 'b'"
        reason = re.match(r"\[Errno \d+\] ([^:]+)", str(why))
        more = len(err.args[0]) - 1
        return f"{dst}: {reason[1] if reason else why}" + (f" (and {more} more)" if more else "")
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{err.strerror or err}"
