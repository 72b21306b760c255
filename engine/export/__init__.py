"""The training set: runs' recorded selections exported as training samples (``export``).

``chat`` and ``atif``: one sample per path of a recorded path selection (the run's default
one, or the one named) - the conversation the model had along the path, root to leaf, with
the path's fields, its nodes' scores and tokens and its turns' eval results; ``dpo``, ``kto``,
``steps``: a supervision selection's pairs, labelled attempts and step labels. Each export
writes a manifest and a dataset card beside its files. The rooms: ``conversations`` (a
path's conversation from its turns' recorded ones, read from the log), ``paths`` (what a
run's chat and atif samples are made of, and their writing), ``formats`` (chat and ATIF v1.4
samples), ``supervised`` (the other three), ``output`` (the files, streamed, hashed, moved
into place whole), ``card`` and ``features`` (the dataset card), ``training`` (a chat
template and trainers that score the assistant's tokens only); for the viewer, rendered by
the same code: ``candidates`` (any path's sample) and ``attempts`` (a node's attempts side
by side).

Which rows, in which order, and which turns make them come from the views
(``int_paths__recorded``, ``int_path_turns``, ``int_pairs__recorded``, ``int_labels__recorded``,
``int_steps__recorded``); an export is a function of the logs and its options: the same logs
and selection give byte-identical files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.export.card import card, coverage, provenance
from engine.export.formats import Lengths
from engine.export.output import MADE_BY, ExportDir
from engine.export.paths import PathRun, prepare_paths, write_paths
from engine.export.supervised import (
    SupervisedRun,
    Written,
    prepare_supervised,
    supervised_samples,
)
from engine.export_formats import BY_NAME, DEFAULT_WORKSPACE, FORMATS
from engine.runs import in_order
from engine.runset import DamagedRun, Reader
from ingest.errors import InputError, OutputError, os_problem
from ingest.log import EventLog
from ingest.paths import outside_data

INVALID_CALLS = ("keep", "drop")


@dataclass
class ExportResult:
    """What ``export`` wrote: the directory and its manifest."""

    out: Path
    manifest: dict[str, Any]
    damaged: list[DamagedRun] = field(default_factory=list)  # runs under data_dir left out (no run named)


def export_runs(
    reader: Reader,
    run_ids: list[str],
    out: Path,
    *,
    selection: str | None = None,
    fmt: str = "chat",
    task: str | None = None,
    stage: str | None = None,
    workspace: str = DEFAULT_WORKSPACE,
    reasoning: bool = True,
    overwrite: bool = False,
    invalid: str = "keep",
    tokenizer: str | None = None,
) -> ExportResult:
    """Export the selected paths of ``run_ids`` (when none: every run holding a selection but the
    damaged ones, named in the result's ``damaged``) to ``out``.

    Runs are exported one after another, one file each (``<run>.<format>.jsonl``),
    then ``manifest.json``. What a run's samples are made of (its paths, their turns'
    conversations) is read while the run before is written (:func:`~engine.runs.in_order`:
    a run per core at once, so at most that many runs' conversations are held). Any
    error leaves ``out`` as it was. ``invalid``: keep or drop the samples with a call
    of a tool the model was not offered; ``tokenizer``: a local Hugging Face tokenizer
    directory whose chat template counts each sample's tokens for the manifest.
    """
    if fmt not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if invalid not in INVALID_CALLS:
        raise InputError(f"--invalid-calls must be one of {', '.join(INVALID_CALLS)}, not {invalid!r}")
    supervised = not BY_NAME[fmt].of_paths
    if supervised and tokenizer:
        raise InputError(f"--tokenizer counts the tokens of chat and atif samples, not of {fmt} ones")
    lengths = Lengths(tokenizer)
    if not workspace.startswith("/") or len(workspace) < 2:
        raise InputError(f"--workspace must be an absolute directory path, not {workspace!r}")
    data_dir = reader.data_dir
    found = reader.runs(run_ids or None).checked()
    runs, damaged = found.run_ids, found.damaged
    if not run_ids:
        runs = _runs_with_selections(data_dir, runs, BY_NAME[fmt].decision)
    target = ExportDir(outside_data(Path(out), data_dir, "the export"), overwrite)
    try:

        def prepare(log: EventLog) -> PathRun | SupervisedRun:
            with reader.open(log.run_id) as catalog:
                if supervised:
                    run = prepare_supervised(log, catalog, selection, fmt, task=task, stage=stage, workspace=workspace)
                else:
                    run = prepare_paths(log, catalog, selection, fmt, task=task, stage=stage, workspace=workspace)
                run.provenance = provenance(catalog)
                if not supervised:  # (last: another selection's weights make the path tables stale)
                    run.coverage = coverage(catalog, run.chosen)
                return run

        records = [
            _write_supervised(target, run, fmt, workspace, reasoning, invalid)
            if supervised
            else write_paths(
                target, run, fmt, workspace=workspace, reasoning=reasoning, invalid=invalid, lengths=lengths
            )
            for run in in_order([EventLog(data_dir, r) for r in runs], prepare)
        ]
        if not any(r["samples"] for r in records):
            _nothing_written(records, runs, fmt, task, stage)
        manifest = _manifest(records, target.files, fmt, selection, task, stage, workspace, reasoning, invalid, lengths)
        options = [
            *(["--selection", selection] if selection else []),
            *(["--task", task] if task else []),
            *(["--stage", stage] if stage else []),
            *(["--workspace", workspace] if workspace != DEFAULT_WORKSPACE else []),
            *([] if reasoning else ["--no-reasoning"]),
            *(["--invalid-calls", invalid] if invalid != "keep" else []),
            *(["--tokenizer", tokenizer] if tokenizer else []),
        ]
        text = card(manifest, target.shapes.shape(), data_dir, options)
        return ExportResult(target.commit(manifest, text), manifest, damaged)
    except OSError as err:
        target.abandon()
        raise OutputError(f"{target.out}: cannot write the export ({os_problem(err)}); nothing was written") from err
    except BaseException:
        target.abandon()
        raise


def _runs_with_selections(data_dir: Path, run_ids: list[str], kind: str) -> list[str]:
    runs_dir = Path(data_dir) / "runs"
    found = [run_id for run_id in run_ids if any(EventLog(data_dir, run_id).scan_kind(kind, ["seq"]))]
    if not found:
        what = "a supervision selection" if kind == "supervision_selected" else "a path selection"
        raise InputError(f"no run under {runs_dir} has {what} - give the RUN_IDs to export")
    return found


def _nothing_written(records: list[dict[str, Any]], runs: list[str], fmt: str, task: str | None, stage: str | None):
    """InputError: no sample was written, and why."""
    wanted = " and ".join(f"{k} {v!r}" for k, v in (("task", task), ("stage", stage)) if v)
    of = f" of {wanted}" if wanted else ""
    dropped = sum(r["invalid_call_samples"] for r in records if "left_out" not in r)
    dropped += sum(r["left_out"]["invalid_calls"] for r in records if "left_out" in r)
    left = f" ({dropped} with invalid calls left out: --invalid-calls drop)" if dropped else ""
    what = BY_NAME[fmt].row
    if BY_NAME[fmt].of_paths:
        raise InputError(f"no {what}{of} in {', '.join(runs)}{left}")
    rules = "; ".join(f"{r['run_id']}: rule {r['rule']}, min margin {r['min_margin']:g}" for r in records)
    why = " (no node has two finished attempts whose values differ by the margin)" if fmt == "dpo" and not of else ""
    unrecorded = sum(r["left_out"]["unrecorded"] for r in records)
    differing = sum(r["left_out"]["differing_prompts"] for r in records)
    if unrecorded or differing:
        why = (
            f" ({unrecorded} left out whose turns recorded no conversation: a run before conversations were "
            "recorded, or an opencode backend without --endpoint; "
            f"{differing} whose two attempts received different prompts)"
        )
    raise InputError(f"no {what}{of} in {', '.join(runs)}{left}{why} [{rules}]")


def _write_supervised(
    target: ExportDir, run: SupervisedRun, fmt: str, workspace: str, reasoning: bool, invalid: str
) -> dict[str, Any]:
    """Write one run's pairs, labels or step paths; return what the manifest says of it."""
    name = f"{run.run_id}.{fmt}.jsonl"
    target.start(name)
    written = Written()
    for sample in supervised_samples(run, fmt, workspace, reasoning, invalid == "drop", written):
        target.write(sample)
    target.end()
    chosen = run.chosen
    return {
        "run_id": run.run_id,
        "log_tail": run.tail,
        "selection_id": chosen["selection_id"],
        "rule": chosen["rule"],
        "min_margin": chosen["min_margin"],
        "threshold": chosen["threshold"],
        "against_verdict": chosen["against_verdict"],
        "file": name,
        "samples": sum(written.counts.values()),
        "left_out": {
            "unrecorded": written.unrecorded,
            "differing_prompts": written.differing_prompts,
            "no_answer": written.no_answer,
            "invalid_calls": written.dropped_invalid,
        },
        "invalid_call_samples": written.invalid,
        **({"against_verdict_pairs": written.against_verdict} if fmt == "dpo" else {}),
        "provenance": run.provenance,
        "supervision": run.counts,
        "counts": written.counts,
    }


def _manifest(
    records: list[dict[str, Any]],
    files: dict[str, dict[str, Any]],
    fmt: str,
    selection: str | None,
    task: str | None,
    stage: str | None,
    workspace: str,
    reasoning: bool,
    invalid: str,
    lengths: Lengths,
) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        for (t, s), n in sorted(record.pop("counts").items()):
            counts.setdefault(t, {})[s] = counts.get(t, {}).get(s, 0) + n
    return {
        "made_by": MADE_BY,
        "format": fmt,
        "selection": selection or "default",
        "filters": {"task": task, "stage": stage},
        "workspace": workspace,
        "reasoning": reasoning,
        "invalid_calls": invalid,
        "runs": records,
        "counts": counts,
        "samples": sum(r["samples"] for r in records),
        "files": files,
        **(lengths.manifest() if BY_NAME[fmt].of_paths else {}),
    }
