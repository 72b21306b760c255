"""A real trainer consumes the export as it is: TRL's SFTTrainer, transformers' chat templates.

The code of docs/TRAINING.md runs as written on an export of the
hand-built run and a sim run (in data/out/train under a temporary directory): it
trains a tokenizer on the samples, builds a tiny causal LM from a config (random
weights, nothing downloaded) and runs SFTTrainer a few steps with the loss on the
assistant turns only. The masks it trained with are checked on a sample by decoding.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import hand_run
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_run

from cli import cli


def snippet(trainer: str = "SFTTrainer") -> str:
    """The Python block of docs/TRAINING.md that trains with ``trainer``."""
    section = (ROOT / "docs" / "TRAINING.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    (code,) = [b for b in blocks if f"{trainer}(" in b]
    return code


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, runs) -> Path:
    """A working directory holding data/out/train: the export of the hand-built run and a sim run."""
    work = tmp_path_factory.mktemp("train")
    data = work / "data"
    hand_run.write(data)
    copy_run(runs, "rounds", data)
    done = CliRunner().invoke(
        cli, ["--data", str(data), "export", "hand", "rounds", "--out", str(data / "out" / "train")]
    )
    assert done.exit_code == 0, done.output
    for fmt, out in (("dpo", "pairs"), ("kto", "labels")):  # docs/TRAINING.md's preference exports
        done = CliRunner().invoke(
            cli, ["--data", str(data), "export", "rounds", "--format", fmt, "--out", str(data / "out" / out)]
        )
        assert done.exit_code == 0, done.output
    return work


@pytest.mark.slow
def test_the_readme_training_code_trains_on_the_export(export_dir, monkeypatch):
    monkeypatch.chdir(export_dir)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(export_dir / "hf-cache"))
    scope: dict = {}
    exec(compile(snippet(), "docs/TRAINING.md", "exec"), scope)  # noqa: S102 - the snippet as written
    train, tokenizer, trainer = scope["train"], scope["tokenizer"], scope["trainer"]
    manifest = json.loads((export_dir / "data" / "out" / "train" / "manifest.json").read_text())
    assert len(train) == manifest["samples"] > 2
    # Every sample rendered, and none was dropped (as one cut off at max_length would be).
    assert len(trainer.train_dataset) == len(train)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == trainer.args.max_steps and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses

    # The masked tokens are exactly the assistant's: decode them on a sample with
    # reasoning, tool calls and their results.
    i = next(
        i for i, s in enumerate(train) if any(m.get("tool_calls") and m.get("reasoning_content") for m in s["messages"])
    )
    sample = train[i]
    tools = json.loads(sample["tools"])
    rendered = tokenizer.apply_chat_template(sample["messages"], tools=tools, tokenize=False)
    enc = tokenizer.apply_chat_template(
        sample["messages"], tools=tools, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assert trainer.train_dataset[i]["input_ids"] == ids  # what the trainer trained on, and its labels:
    assert [label != -100 for label in trainer.train_dataset[i]["labels"]] == [bool(m) for m in mask]
    spans = re.findall(r"<\|assistant\|>\n(.*?<\|end\|>)", rendered, re.S)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    left = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert trained == "".join(spans)
    rest = rendered
    for span in spans:
        rest = rest.replace(span, "", 1)
    assert left == rest
    for m in sample["messages"]:
        if m["role"] == "assistant":
            assert (m.get("content") or "") in trained and (m.get("reasoning_content") or "") in trained
            for c in m.get("tool_calls") or []:
                assert c["function"]["arguments"] in trained
        elif m.get("content"):
            assert m["content"] in left
    assert json.dumps(tools[0]) in left


@pytest.mark.slow
def test_the_preference_training_code_trains_dpo_and_kto_on_the_exports(export_dir, monkeypatch):
    monkeypatch.chdir(export_dir)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(export_dir / "hf-cache"))
    code = snippet("DPOTrainer")
    assert "KTOTrainer(" in code
    scope: dict = {}
    exec(compile(code, "docs/TRAINING.md", "exec"), scope)  # noqa: S102 - the snippet as written
    out = export_dir / "data" / "out"
    for name, folder, fmt in (("dpo", "pairs", "dpo"), ("kto", "labels", "kto")):
        trainer = scope[name]
        manifest = json.loads((out / folder / "manifest.json").read_text())
        # Every row rendered and none dropped (as one cut off at max_length would be).
        assert len(trainer.train_dataset) == manifest["samples"] > 2, name
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert len(losses) == trainer.args.max_steps and all(math.isfinite(x) for x in losses), (name, losses)
        assert len(set(losses)) > 1, (name, losses)  # the loss moves
        row = json.loads((out / folder / f"rounds.{fmt}.jsonl").read_text().splitlines()[0])
        tokenizer = scope["tokenizer"]
        tools = json.loads(row["tools"])
        side = row["chosen"] if fmt == "dpo" else row["completion"]
        rendered = tokenizer.apply_chat_template(row["prompt"] + side, tools=tools, tokenize=False)
        assert all((m.get("content") or "") in rendered for m in row["prompt"] + side)
    assert {r["label"] for r in scope["labels"]} == {True, False}  # KTO saw both kinds


@pytest.mark.slow
def test_every_sample_renders_with_apply_chat_template_and_the_manifest_counts_tokens(export_dir, tmp_path):
    """transformers' apply_chat_template(messages, tools=...) takes every sample, tools parsed from JSON;
    ``export --tokenizer`` gives each sample's tokens as that template renders it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from engine.export.training import CHAT_TEMPLATE, EOS, PAD, SPECIAL_TOKENS

    texts = [line for f in (export_dir / "data" / "out" / "train").glob("*.chat.jsonl") for line in f.open()]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=500, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE)
    saved = tmp_path / "tokenizer"
    tokenizer.save_pretrained(saved)
    data = export_dir / "data"
    out = tmp_path / "counted"
    done = CliRunner().invoke(
        cli, ["--data", str(data), "export", "hand", "rounds", "--out", str(out), "--tokenizer", str(saved)]
    )
    assert done.exit_code == 0, done.output
    manifest = json.loads((out / "manifest.json").read_text())
    rows = [
        json.loads(line)
        for f in ("hand.chat.jsonl", "rounds.chat.jsonl")
        for line in (out / f).read_text().splitlines()
    ]
    assert len(rows) == len(manifest["lengths"]) == manifest["samples"]
    for row, length in zip(rows, manifest["lengths"], strict=True):
        with pytest.raises(Exception):  # noqa: B017 - the JSON string itself is no tool list
            tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        ids = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), return_dict=True)
        assert length["tokens"] == len(ids["input_ids"]) > 0
    assert manifest["max_tokens"] == max(r["tokens"] for r in manifest["lengths"])
    assert manifest["tokenizer"] == str(saved)
