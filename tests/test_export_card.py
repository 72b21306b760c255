"""The dataset card every export writes (README.md): Hugging Face's `datasets.load_dataset(<export dir>)`
loads each format through it, every row as written; its figures are audit's; it says where the rows came from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from engine.export import features
from engine.export.features import NULL, RowShapes, merge, shape_of, yaml_features

FORMATS = ("chat", "atif", "dpo", "kto", "steps")


def invoke(data: Path, *args: str):
    return CliRunner().invoke(cli, ["--data", str(data), *args])


def present(value):
    """A value without its null fields: what a loader fills in for a field a row lacks is null."""
    if isinstance(value, dict):
        return {k: present(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [present(v) for v in value]
    return value


def typed(path: Path) -> tuple:
    """The shape RowShapes gives the rows of a file fed as export feeds them (chunks of a few KB here)."""
    shapes = RowShapes()
    try:
        for line in path.read_bytes().splitlines(keepends=True):
            shapes.add(line)
        return shapes.shape()
    finally:
        shapes.close()


def load(directory: Path, cache: Path, **options):
    from datasets import load_dataset

    return load_dataset(str(directory), split="train", cache_dir=str(cache), **options)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_load_dataset_of_the_export_directory_loads_every_row_as_written(runs, tmp_path, fmt):
    out = tmp_path / fmt
    r = invoke(runs, "export", "rounds", "async", "--format", fmt, "--out", str(out))
    assert r.exit_code == 0, r.output
    written = [json.loads(line) for f in sorted(out.glob(f"*.{fmt}.jsonl")) for line in f.open()]
    # Read in small blocks, as a large export is: the first block's fields are not every row's.
    loaded = load(out, tmp_path / "hf", chunksize=4096)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(loaded) == len(written) == manifest["samples"] > 0  # both runs' files, not the manifest
    key = lambda row: json.dumps(row, sort_keys=True)  # noqa: E731
    assert sorted(map(key, map(present, loaded))) == sorted(map(key, map(present, written)))
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and f'path: "*.{fmt}.jsonl"' in card


def test_declared_features_load_rows_whose_fields_appear_late_where_inferred_ones_fail(tmp_path, monkeypatch):
    """The card declares the features merged over every row: a field that first appears after the
    loader's first block (a message's reasoning) loads; inferred from the first block, it does not."""
    rows = [
        {"messages": [{"role": "assistant", "content": "x" * 60}], "metadata": {"n": i, "score": None}}
        for i in range(1500)
    ]
    rows[-1]["messages"][0]["reasoning_content"] = "late"
    rows[-1]["metadata"]["score"] = 1.5
    rows[-2]["metadata"]["score"] = 2  # an integer among floats
    for where in ("declared", "inferred"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "r.chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shape = NULL
    for row in rows:
        shape = merge(shape, shape_of(row))
    monkeypatch.setattr(features, "CHUNK", 4096)  # many chunks: typed apart, merged
    assert typed(tmp_path / "declared" / "r.chat.jsonl") == shape
    header = ["configs:", "- config_name: default", "  data_files:", "  - split: train", '    path: "*.chat.jsonl"']
    header += ["dataset_info:", "  features:", *yaml_features(shape, 2)]
    (tmp_path / "declared" / "README.md").write_text("---\n" + "\n".join(header) + "\n---\n")
    loaded = load(tmp_path / "declared", tmp_path / "hf", chunksize=4096)
    assert (
        loaded[-1]["messages"][0]["reasoning_content"] == "late"
        and loaded[0]["messages"][0]["reasoning_content"] is None
    )
    assert [r["metadata"]["score"] for r in loaded][-3:] == [None, 2.0, 1.5]
    with pytest.raises(Exception):  # noqa: B017 - datasets' own error for a schema that changed
        load(tmp_path / "inferred", tmp_path / "hf", chunksize=4096)


def test_a_chunks_fields_are_typed_in_the_order_its_rows_first_give_them():
    """The card is written byte for byte again from the same logs: Arrow typing a chunk's blocks on several
    threads ordered a struct's new fields by which block finished first (4 orders in 30 typings of this chunk)."""
    rows = [{"a": i, "text": "x" * 60, f"k{i // 4000}": i} for i in range(40_000)]  # a new key every ~0.4 MB
    chunk = "".join(json.dumps(r) + "\n" for r in rows).encode()
    assert len(chunk) > 3 * features.BLOCK
    typed = {features.chunk_shape(chunk) for _ in range(10)}
    assert [[name for name, _ in shape[1]] for shape in typed] == [["a", "text", *(f"k{i}" for i in range(10))]]


def test_values_no_arrow_type_holds_together_are_declared_json_and_load_as_written(tmp_path, monkeypatch):
    rows = [{"content": "text"}, {"content": [{"type": "text", "text": "parts"}]}, {"content": None}]
    shape = NULL
    for row in rows:
        shape = merge(shape, shape_of(row))
    assert shape == ("struct", (("content", ("json",)),))
    assert yaml_features(shape) == ['- name: "content"', '  dtype: "json"']
    (tmp_path / "r.chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(features, "CHUNK", 4096)
    assert typed(tmp_path / "r.chat.jsonl") == shape  # (Arrow cannot type it: walked in Python)
    header = ["configs:", "- config_name: default", "  data_files:", "  - split: train", '    path: "*.chat.jsonl"']
    header += ["dataset_info:", "  features:", *yaml_features(shape, 2)]
    (tmp_path / "README.md").write_text("---\n" + "\n".join(header) + "\n---\n")
    assert [r["content"] for r in load(tmp_path, tmp_path / "hf")] == [r["content"] for r in rows]


@pytest.mark.slow
def test_the_cards_figures_are_audits_and_name_where_the_rows_came_from(runs, tmp_path):
    audit = json.loads(invoke(runs, "audit", "rounds", "--json").stdout)
    for fmt in ("chat", "dpo"):
        out = tmp_path / fmt
        r = invoke(runs, "export", "rounds", "--format", fmt, "--out", str(out))
        assert r.exit_code == 0, r.output
        manifest = json.loads((out / "manifest.json").read_text())
        card = (out / "README.md").read_text()
        (run,) = manifest["runs"]
        if fmt == "chat":
            # N_eff of the selection overall, by task and by stage: audit's coverage rows.
            wanted = {(c["stratum"], c["stratum_key"]): c for c in audit["coverage"] if c["stratum"] != "depth"}
            assert run["coverage"] and all(
                (c["selected_paths"], c["n_eff"]) == (wanted[key]["selected_paths"], wanted[key]["n_eff"])
                for c in run["coverage"]
                for key in [(c["stratum"], c["stratum_key"])]
            )
            (overall,) = [c for c in run["coverage"] if c["stratum"] == "all"]
            assert f"| rounds | all | all | {overall['selected_paths']} | {overall['n_eff']:.6g} |" in card
        else:
            # Pairs, their fork points and pair_n_eff by task and stage: audit's supervision rows.
            recorded = [s for s in audit["supervision"] if s["selection_id"] == run["selection_id"]]
            strip = lambda rows: [{k: v for k, v in r.items() if k not in ("run_id", "selection_id")} for r in rows]  # noqa: E731
            assert strip(run["supervision"]) == strip(recorded) and recorded
            for row in run["supervision"]:
                assert (
                    f"| rounds | {row['task']} | {row['stage']} | {row['pairs']} | {row['against_verdict']} |" in card
                )
        # Where the rows came from: the run's task, direction, Teacher, versions, dates, what it cost.
        facts = json.loads(invoke(runs, "sql", "rounds", "select * from run_provenance", "--json").stdout)[0]
        assert run["provenance"]["tokens"] == facts["tokens"] > 0
        assert run["provenance"]["teacher_versions"] == facts["teacher_versions"] != []
        assert f"| rounds | kernel-speedup | maximize | sim | - | {facts['teacher_versions'][0]} |" in card
        assert str(facts["tokens"]) in card and facts["started_at"][:10] in card
        # The command that writes the same files again, run as the card gives it.
        (command,) = re.findall(r"```bash\n(teacher-mcts .*)\n```", card)
        again = tmp_path / f"{fmt}-again"
        words = command.replace(" --out OUT", "").split()[1:]
        assert invoke(Path(words[1]), *words[2:], "--out", str(again)).exit_code == 0
        assert {p.name: p.read_bytes() for p in again.iterdir()} == {p.name: p.read_bytes() for p in out.iterdir()}
