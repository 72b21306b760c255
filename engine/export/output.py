"""The export's directory: JSONL files written as they stream, hashed, then moved into place whole.

Files are written into a hidden sibling of the output directory and renamed into
place at the end, so the output directory never holds a partial export; an earlier
export is replaced only with ``overwrite`` (a directory holding a manifest written
by ``export``, its dataset card and the files it lists, nothing else).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO

from engine.export.features import RowShapes
from ingest.errors import InputError, OutputError, os_problem
from ingest.paths import replace_dir, staging_dir

MANIFEST = "manifest.json"
CARD = "README.md"  # the dataset card (engine/export/card.py)
MADE_BY = "teacher-mcts export"


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an output directory that holds anything but (with ``overwrite``) an earlier export."""
    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    names = set(os.listdir(out))
    if not names:
        return
    earlier = _earlier_export(out)
    if earlier is None or names - earlier:
        raise InputError(f"{out}: not empty and not an earlier export - choose another --out")
    if not overwrite:
        raise InputError(f"{out}: holds an earlier export - give --overwrite to replace it")


def _earlier_export(out: Path) -> set[str] | None:
    """The names an earlier export in ``out`` consists of, or None if it is not one."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("made_by") != MADE_BY:
        return None
    return {MANIFEST, CARD, *manifest.get("files", {})}


class ExportDir:
    """Writes the files of one export into a staging directory; :meth:`commit` moves it into place."""

    def __init__(self, out: Path, overwrite: bool) -> None:
        self.out = Path(out).resolve()
        self.overwrite = overwrite
        check_out(self.out, overwrite)
        self.files: dict[str, dict[str, Any]] = {}
        self.shapes = RowShapes()  # every row's features merged (the dataset card declares them)
        self._open: tuple[str, BinaryIO, Any] | None = None
        try:
            self.staging = staging_dir(self.out)
        except OSError as err:
            raise OutputError(f"{self.out}: cannot write the export ({os_problem(err)})") from err

    def start(self, name: str) -> None:
        """Begin the JSONL file ``name``."""
        self.end()
        self._open = (name, open(self.staging / name, "wb"), hashlib.sha256())  # noqa: SIM115 - end() closes it
        self.files[name] = {"samples": 0}

    def write(self, sample: dict[str, Any]) -> None:
        """Append one sample (one line of compact JSON) to the current file.

        Keys keep the order the sample was built in (a tool call's arguments as the model
        wrote them): the same logs build the same samples, so the files are byte-identical.
        """
        assert self._open is not None
        name, fh, digest = self._open
        line = (json.dumps(sample, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode()
        fh.write(line)
        digest.update(line)
        self.shapes.add(line)
        self.files[name]["samples"] += 1

    def end(self) -> None:
        """Finish the current file: its size and sha256 go to :attr:`files`."""
        if self._open is None:
            return
        name, fh, digest = self._open
        self._open = None
        size = fh.tell()
        fh.close()
        self.files[name].update(bytes=size, sha256=digest.hexdigest())

    def commit(self, manifest: dict[str, Any], card: str) -> Path:
        """Write the manifest and the dataset card and move the export into place (replacing an earlier one)."""
        self.end()
        self.shapes.close()
        (self.staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (self.staging / CARD).write_text(card)
        replace_dir(self.staging, self.out, lambda: check_out(self.out, self.overwrite))
        return self.out

    def abandon(self) -> None:
        """Remove the staging directory (an export that failed leaves nothing)."""
        self.shapes.close()
        if self._open is not None:
            self._open[1].close()
            self._open = None
        shutil.rmtree(self.staging, ignore_errors=True)
