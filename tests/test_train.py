"""A real trainer consumes the export as it is: TRL's trainers, transformers' chat templates.

The code of docs/TRAINING.md runs as written on an export of the
hand-built run and a sim run (in data/out/train under a temporary directory): it
trains a tokenizer on the samples, builds a tiny causal LM from a config (random
weights, nothing downloaded) and runs SFTTrainer a few steps with the loss on the
assistant turns only. The masks it trained with are checked on a sample by decoding.
Its DPO and KTO code runs engine.export.training's AssistantOnlyDPOTrainer and
AssistantOnlyKTOTrainer on the sim run's dpo and kto exports: what their collated
batches score is checked token by token against the assistant spans of the rendered
text, in the export's layout of a row and in the other one.
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
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
    exec(compile(snippet(), "docs/TRAINING.md", "exec"), scope)  # the snippet as written
    train, tokenizer, trainer = scope["train"], scope["tokenizer"], scope["trainer"]
    manifest = json.loads((export_dir / "data" / "out" / "train" / "manifest.json").read_text())
    assert len(train) == manifest["samples"] > 2
    # Every sample rendered, and none was dropped (as one cut off at max_length would be).
    assert len(trainer.train_dataset) == len(train)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == trainer.args.max_steps and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
    assert all(h["grad_norm"] > 1e-3 for h in trainer.state.log_history if "loss" in h)  # learning at every step

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


ASSISTANT_SPAN = re.compile(r"<\|assistant\|>\n(.*?<\|end\|>)", re.S)


@pytest.fixture(scope="module")
def preference(export_dir) -> dict:
    """docs/TRAINING.md's DPO and KTO code, run as written on the exports: the names it defines."""
    scope: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(export_dir)
        mp.setenv("HF_DATASETS_CACHE", str(export_dir / "hf-cache"))
        code = snippet("AssistantOnlyDPOTrainer")
        assert "AssistantOnlyKTOTrainer(" in code
        exec(compile(code, "docs/TRAINING.md", "exec"), scope)  # the snippet as written
    return scope


SIDES = {"dpo": ("chosen", "rejected"), "kto": ("completion",)}


def assistant_flags(tokenizer, row: dict, side: str) -> list[bool]:
    """Whether each of ``row``'s ``side`` tokens is the assistant's, decided from the rendered text alone: the
    token starts inside a span from ``<|assistant|>\\n`` to ``<|end|>`` (the markers' own text excluded)."""
    rendered = tokenizer.apply_chat_template(row["prompt"] + row[side], tools=json.loads(row["tools"]), tokenize=False)
    enc = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == row["prompt_ids"] + row[f"{side}_ids"]  # the text of what TRL tokenized
    spans = [m.span(1) for m in ASSISTANT_SPAN.finditer(rendered)]
    flags = [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"]]
    return flags[len(row["prompt_ids"]) :]


def scored_tokens(trainer, collator, sides: tuple[str, ...]) -> tuple[int, int, int]:
    """Every row of ``trainer``'s train dataset collated alone by ``collator``, and its scored tokens
    (``completion_mask``, and ``KL_completion_mask``) compared with the assistant's: (scored tokens that are not
    the assistant's, scored tokens, assistant tokens of the sides left unscored)."""
    tokenizer = trainer.processing_class
    rows = list(trainer.train_dataset)
    flags = {tuple(row[f"{side}_ids"]): assistant_flags(tokenizer, row, side) for row in rows for side in sides}
    foreign = scored = unscored = 0
    for row in rows:
        batch = collator([row])
        # a DPO batch is [chosen, rejected]; KTO's KL row is this prompt followed by another row's completion
        seqs = [
            (batch["input_ids"][k], batch["completion_mask"][k], row[f"{side}_ids"]) for k, side in enumerate(sides)
        ]
        if "KL_completion_mask" in batch:
            seqs.append((batch["KL_input_ids"][0], batch["KL_completion_mask"][0], row["KL_completion_ids"]))
        start = len(row["prompt_ids"])
        for ids, mask, side_ids in seqs:
            assert ids[start : start + len(side_ids)].tolist() == side_ids
            side_flags, side_mask = flags[tuple(side_ids)], mask[start : start + len(side_ids)].tolist()
            assert not mask[:start].any() and not mask[start + len(side_ids) :].any()
            scored += sum(side_mask)
            foreign += sum(1 for m, f in zip(side_mask, side_flags, strict=True) if m and not f)
            unscored += sum(1 for m, f in zip(side_mask, side_flags, strict=True) if f and not m)
    return foreign, scored, unscored


def assert_scores_the_assistant_only(trainer, name: str) -> None:
    """The trainer's collated batches score every assistant token of a side and nothing else, where plain TRL's
    collator (the one it wraps) scores other tokens too."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    plain = trainer.data_collator.collator
    assert type(plain) is {"dpo": DataCollatorForPreference, "kto": DataCollatorForUnpairedPreference}[name]
    foreign, scored, unscored = scored_tokens(trainer, trainer.data_collator, SIDES[name])
    assert (foreign, unscored) == (0, 0) and scored > 0, (name, foreign, scored, unscored)
    foreign, scored, unscored = scored_tokens(trainer, plain, SIDES[name])
    assert foreign > 0.1 * scored and unscored == 0, (name, foreign, scored)  # plain TRL: tool results and prompts


def other_layout(row: dict, sides: tuple[str, ...]) -> dict | None:
    """``row`` cut the other way: a side starting with its turn's user prompt (the layout of older exports) gets it
    moved to the end of the prompt (when every side starts with the same one), and a prompt ending with the user
    prompt gets it moved to the start of every side."""
    row = dict(row)
    first = row[sides[0]][0]
    if first["role"] == "user":
        if any(row[side][0] != first for side in sides):
            return None
        row["prompt"] = row["prompt"] + [first]
        for side in sides:
            row[side] = row[side][1:]
    else:
        assert row["prompt"][-1]["role"] == "user", row["prompt"][-1]
        for side in sides:
            row[side] = [row["prompt"][-1]] + row[side]
        row["prompt"] = row["prompt"][:-1]
    return row


def losses_and_grad_norms(trainer) -> tuple[list[float], list[float]]:
    logged = [h for h in trainer.state.log_history if "loss" in h]
    return [h["loss"] for h in logged], [h["grad_norm"] for h in logged]


@pytest.mark.slow
def test_the_preference_training_code_trains_dpo_and_kto_on_the_assistant_tokens(preference, export_dir):
    """docs/TRAINING.md's DPO and KTO code trains on every row, its loss moves with a gradient at every step, and
    every row's collated batch scores the assistant's tokens of its sides (KTO's KL sequences too), no other."""
    out = export_dir / "data" / "out"
    for name, folder in (("dpo", "pairs"), ("kto", "labels")):
        trainer = preference[name]
        manifest = json.loads((out / folder / "manifest.json").read_text())
        # Every row rendered and none dropped (as one cut off at max_length would be).
        assert len(trainer.train_dataset) == manifest["samples"] > 2, name
        losses, grad_norms = losses_and_grad_norms(trainer)
        assert len(losses) == trainer.args.max_steps and all(math.isfinite(x) for x in losses), (name, losses)
        assert len(set(losses)) == len(losses), (name, losses)  # the loss moves at every step
        assert all(g > 1e-3 for g in grad_norms), (name, grad_norms)  # and there is something to learn from
        assert_scores_the_assistant_only(trainer, name)
        row = json.loads((out / folder / f"rounds.{name}.jsonl").read_text().splitlines()[0])
        tools = json.loads(row["tools"])
        side = row["chosen"] if name == "dpo" else row["completion"]
        rendered = preference["tokenizer"].apply_chat_template(row["prompt"] + side, tools=tools, tokenize=False)
        assert all((m.get("content") or "") in rendered for m in row["prompt"] + side)
    assert "KL_completion_mask" in preference["kto"].data_collator([preference["kto"].train_dataset[0]])
    assert {r["label"] for r in preference["labels"]} == {True, False}  # KTO saw both kinds


@pytest.mark.slow
def test_the_assistant_only_trainers_score_the_assistant_tokens_in_either_layout_of_a_row(preference, tmp_path):
    """A row whose sides start with the turn's user prompt (TRL: the prompt is not a prefix) and one whose prompt
    ends with it are scored alike: the assistant's tokens, no other."""
    from datasets import Dataset
    from trl import DPOConfig, KTOConfig

    from engine.export.training import AssistantOnlyDPOTrainer, AssistantOnlyKTOTrainer

    common = dict(
        max_length=preference["max_length"],
        per_device_train_batch_size=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
    )
    for name, data, trainer_class, config in (
        ("dpo", preference["pairs"], AssistantOnlyDPOTrainer, DPOConfig),
        ("kto", preference["labels"], AssistantOnlyKTOTrainer, KTOConfig),
    ):
        rows = [other_layout(row, SIDES[name]) for row in data]
        rows = [row for row in rows if row is not None]
        assert len(rows) > len(data) / 2, name
        policy = preference["tiny_model"]()
        trainer = trainer_class(
            model=policy,
            ref_model=copy.deepcopy(policy),
            args=config(output_dir=str(tmp_path / name), **common),
            train_dataset=Dataset.from_list(rows),
            processing_class=preference["tokenizer"],
        )
        assert len(trainer.train_dataset) == len(rows)
        assert_scores_the_assistant_only(trainer, name)


def token_log_probs(model, prompt_ids: list[int], side_ids: list[int]) -> list[float]:
    """The model's log-probability of each of ``side_ids`` after ``prompt_ids`` and the side's tokens before it."""
    import torch

    ids = torch.tensor([prompt_ids + side_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    per_token = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]  # token t given the tokens before
    return per_token[len(prompt_ids) - 1 :].tolist()


@pytest.mark.slow
def test_reference_log_probs_precomputed_sum_the_assistant_tokens_only(preference, tmp_path):
    """``precompute_ref_log_probs`` goes through the same collator: each precomputed reference log-probability is
    the sum of the model's log-probabilities of the side's assistant tokens (KTO's KL sequences too)."""
    from trl import DPOConfig, KTOConfig

    from engine.export.training import AssistantOnlyDPOTrainer, AssistantOnlyKTOTrainer

    tokenizer = preference["tokenizer"]
    common = dict(
        max_length=preference["max_length"],
        per_device_train_batch_size=2,
        precompute_ref_log_probs=True,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
    )
    tokens = preference["tokens"]
    shortest = {  # the 4 shortest rows of each export: enough to check, and quick
        name: sorted(
            range(len(data)),
            key=lambda i: max(tokens(data[i]["prompt"], data[i][s], data[i]["tools"]) for s in SIDES[name]),
        )[:4]
        for name, data in (("dpo", preference["pairs"]), ("kto", preference["labels"]))
    }
    for name, data, trainer_class, config in (
        ("dpo", preference["pairs"], AssistantOnlyDPOTrainer, DPOConfig),
        ("kto", preference["labels"], AssistantOnlyKTOTrainer, KTOConfig),
    ):
        model = preference["tiny_model"]().eval()
        trainer = trainer_class(
            model=model,
            args=config(output_dir=str(tmp_path / name), **common),
            train_dataset=data.select(shortest[name]),
            processing_class=tokenizer,
        )
        rows = list(trainer.train_dataset)
        flags = {tuple(r[f"{s}_ids"]): assistant_flags(tokenizer, r, s) for r in rows for s in SIDES[name]}
        keys = {
            "dpo": [("ref_chosen_logps", "chosen_ids"), ("ref_rejected_logps", "rejected_ids")],
            "kto": [("ref_logps", "completion_ids"), ("ref_KL_logps", "KL_completion_ids")],
        }[name]
        for row in rows:
            for key, ids in keys:
                logps = token_log_probs(model, row["prompt_ids"], row[ids])
                assistant = sum(lp for lp, f in zip(logps, flags[tuple(row[ids])], strict=True) if f)
                assert math.isclose(row[key], assistant, rel_tol=1e-4), (name, key, row[key], assistant)
                assert not math.isclose(row[key], sum(logps), rel_tol=1e-2), (name, key, sum(logps))  # plain TRL's


@pytest.mark.slow
def test_a_template_without_generation_markers_or_a_rendering_unlike_trls_is_refused(preference, tmp_path):
    from trl import DPOConfig

    from engine.export.training import CHAT_TEMPLATE, AssistantOnlyDPOTrainer, _side_mask

    tokenizer = copy.deepcopy(preference["tokenizer"])
    tokenizer.chat_template = re.sub(r"\{%-? *(end)?generation *-?%\}", "", CHAT_TEMPLATE)
    assert not re.search(r"\{%-? *(end)?generation", tokenizer.chat_template)
    policy = preference["tiny_model"]()
    with pytest.raises(ValueError, match=r"row 0 of the train dataset: chosen holds an assistant message .*generation"):
        AssistantOnlyDPOTrainer(
            model=policy,
            ref_model=copy.deepcopy(policy),
            args=DPOConfig(
                output_dir=str(tmp_path), max_length=preference["max_length"], report_to="none", use_cpu=True
            ),
            train_dataset=preference["pairs"].select(range(2)),
            processing_class=tokenizer,
        )
    row = dict(preference["dpo"].train_dataset[0])
    row["chosen_ids"] = row["chosen_ids"][:-1]  # a side's tokens the template does not render
    with pytest.raises(ValueError, match=r"row 7 of the train dataset: prompt \+ chosen renders to \d+ tokens"):
        _side_mask(preference["tokenizer"], row, "chosen", 7, "train")


def test_the_training_module_imports_without_trl_or_torch():
    """engine.export.training's constants import without TRL and torch (the ``train`` extra); its trainers need them."""
    code = (
        "import sys\n"
        "sys.modules.update(trl=None, torch=None, transformers=None, datasets=None)\n"
        "import engine.export.training as t\n"
        "assert t.CHAT_TEMPLATE and t.EOS in t.SPECIAL_TOKENS and t.AssistantOnlyCollator\n"
        "try:\n"
        "    t.AssistantOnlyDPOTrainer\n"
        "except ImportError:\n"
        "    print('no trl')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no trl\n"


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
