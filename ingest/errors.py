"""The project's error hierarchy; the CLI turns every ProjectError into a clean message."""

from __future__ import annotations


class ProjectError(Exception):
    """Base of every error the project raises on purpose."""


class InputError(ValueError, ProjectError):
    """Input files or arguments that cannot be used as given."""


class LogError(ProjectError):
    """The event log is missing, locked or inconsistent."""


class SeqConflictError(LogError):
    """An append expected a different tail sequence number."""


class WriterLockedError(LogError):
    """Another process is already writing this run."""


class ViewBuildError(ProjectError):
    """A view in views/ could not be created."""


class ViewNotFoundError(KeyError, ProjectError):
    """A view name that the catalog does not know."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "view not found"
