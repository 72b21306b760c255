"""What a trainer needs beside the export's files: a chat template that renders them, and DPO and KTO
trainers that score the assistant's tokens only.

``CHAT_TEMPLATE`` (``chat_template.jinja`` beside this file) renders a chat sample -
system prompt, tools, user prompts, the assistant's reasoning, text and tool calls,
tool results - with the assistant messages inside ``{% generation %}`` markers, so
that ``apply_chat_template(..., return_assistant_tokens_mask=True)`` and TRL's
``assistant_only_loss`` count exactly the assistant's tokens. Its special tokens are
``SPECIAL_TOKENS``; ``<|end|>`` ends every message (the EOS a model learns to stop on).
A model with a chat template of its own (and generation markers) needs none of this.

``AssistantOnlyDPOTrainer`` and ``AssistantOnlyKTOTrainer`` are TRL's ``DPOTrainer`` and
``KTOTrainer`` (as pinned, 1.16), taking the same arguments, whose losses and reference
log-probabilities count the assistant's tokens only. TRL's own score every token after the
prompt, and a ``dpo`` or ``kto`` row's ``chosen``, ``rejected`` or ``completion`` is a whole
attempt: its user prompts, tool results and eval output are not the model's tokens (about a
third of what TRL's DPO loss scored on a sim export). The classes change three things:

- ``_prepare_dataset``: after TRL's (which tokenizes ``prompt_ids`` and ``<side>_ids``), one more
  map renders ``prompt + side`` with ``return_assistant_tokens_mask=True``, checks that its ids are
  exactly ``prompt_ids + <side>_ids`` (else ``ValueError``, naming the row), and stores the mask of
  the side's part as ``<side>_assistant_mask``; KTO's ``KL_completion_assistant_mask`` is that mask
  rotated as TRL rotated ``KL_completion_ids``, checked against them. A side with an assistant
  message whose mask marks no token raises: the chat template has no ``{% generation %}`` markers.
- ``_set_signature_columns_if_needed``: the mask columns survive ``remove_unused_columns``.
- ``data_collator``: whatever collator the trainer gets (TRL's by default) is wrapped in
  ``AssistantOnlyCollator``, which runs it a second time on the examples with their id lists
  replaced by the masks, so the masks are truncated and padded exactly as the ids are, and
  multiplies ``completion_mask`` (and ``KL_completion_mask``) by them. The attribute is set in
  ``Trainer.__init__``, before TRL precomputes reference log-probs with it
  (``precompute_ref_log_probs``), so those are masked too, as is the reference model's forward
  in the loss (it reads the same ``completion_mask``).

The rows must be conversational (lists of messages) and the tokenizer's template must mark the
assistant's messages with ``{% generation %}`` (``CHAT_TEMPLATE`` does). Both layouts of a row are
scored right: a prompt ending with a tool or system message and a side starting with the turn's
user prompt (TRL then warns that the prompt is not a prefix, and starts the side where the
renderings diverge), or a prompt ending with the user prompt and sides starting with the answer.

The trainer classes subclass TRL's, so they are built on first access (a module ``__getattr__``,
PEP 562): ``from engine.export.training import AssistantOnlyDPOTrainer`` imports TRL and torch then,
while ``CHAT_TEMPLATE`` and the other constants import without them (``export`` reads them, and
TRL is an optional extra). Defining the classes in a function called from ``__getattr__`` keeps one
module and no import-time cost; everything that does not subclass TRL is plain module code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (Path(__file__).with_name("chat_template.jinja")).read_text()
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|tools|>"]
EOS = "<|end|>"
PAD = "<|pad|>"

_TRAINERS = ("AssistantOnlyDPOTrainer", "AssistantOnlyKTOTrainer")


def __getattr__(name: str) -> Any:
    """The trainer classes, built (and TRL imported) on first access."""
    if name in _TRAINERS:
        globals().update(_trainer_classes())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _mask_column(side: str) -> str:
    return f"{side}_assistant_mask"


class AssistantOnlyCollator:
    """A DPO or KTO collator whose ``completion_mask`` (and ``KL_completion_mask``) marks the assistant's tokens only.

    ``collator`` is the trainer's (TRL's ``DataCollatorForPreference`` or ``DataCollatorForUnpairedPreference``); each
    example carries ``<side>_assistant_mask`` beside ``<side>_ids`` for every side in ``sides`` (and
    ``KL_completion_assistant_mask`` beside ``KL_completion_ids``). The collator runs on the examples, then on copies
    whose id lists are the masks (the prompt's all 0): its ``input_ids`` are then the masks laid out exactly as the
    ids (truncated at ``max_length`` by ``truncation_mode``, padded, ``pad_to_multiple_of``). A completion position
    stays scored where that layout holds 1; padding is no completion position, whatever the pad id.
    """

    def __init__(self, collator, sides: tuple[str, ...]) -> None:
        self.collator = collator
        self.sides = sides

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(examples)
        layout = self.collator([self._masks_as_ids(example) for example in examples])
        for prefix in ("", "KL_"):
            key = f"{prefix}completion_mask"
            if key not in batch:
                continue
            if not layout[key].equal(batch[key]):
                raise RuntimeError(f"{type(self.collator).__name__} lays out the masks unlike the ids: not by length")
            batch[key] = batch[key] * (layout[f"{prefix}input_ids"] == 1).to(batch[key].dtype)
        return batch

    def _masks_as_ids(self, example: dict[str, Any]) -> dict[str, Any]:
        pairs = [(f"{side}_ids", _mask_column(side)) for side in self.sides]
        if "KL_completion_ids" in example:
            pairs.append(("KL_completion_ids", _mask_column("KL_completion")))
        masked: dict[str, Any] = {"prompt_ids": [0] * len(example["prompt_ids"])}
        for ids, mask in pairs:
            if mask not in example:
                raise ValueError(
                    f"an example without {mask!r}: AssistantOnlyCollator takes the rows an AssistantOnly trainer "
                    f"prepared (conversational rows; not vision ones, which TRL does not tokenize up front)"
                )
            if len(example[mask]) != len(example[ids]):
                raise ValueError(f"{mask!r} has {len(example[mask])} entries for {len(example[ids])} tokens of {ids!r}")
            masked[ids] = list(example[mask])
        if "label" in example:
            masked["label"] = example["label"]
        return masked


def _side_mask(processing_class, row: dict[str, Any], side: str, index: int, dataset_name: str) -> list[int]:
    """The assistant mask of ``row``'s ``side`` tokens, from the rendering of ``prompt + side``."""
    if not isinstance(row["prompt"], list) or not isinstance(row[side], list):
        raise ValueError(
            f"row {index} of the {dataset_name} dataset is not conversational: the assistant's tokens are found by "
            "the chat template, which needs lists of messages"
        )
    tools = row.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    messages = row["prompt"] + row[side]
    enc = processing_class.apply_chat_template(
        messages,
        tools=tools,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        **(row.get("chat_template_kwargs") or {}),
    )
    ids, prompt_ids, side_ids = list(enc["input_ids"]), list(row["prompt_ids"]), list(row[f"{side}_ids"])
    if ids != prompt_ids + side_ids:
        trl_ids = prompt_ids + side_ids
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, trl_ids, strict=False)) if a != b), min(len(ids), len(trl_ids))
        )
        raise ValueError(
            f"row {index} of the {dataset_name} dataset: prompt + {side} renders to {len(ids)} tokens, TRL's "
            f"prompt_ids + {side}_ids are {len(trl_ids)} ({len(prompt_ids)} + {len(side_ids)}); they differ from "
            f"token {at}: {processing_class.decode(ids[at : at + 16])!r} against "
            f"{processing_class.decode(trl_ids[at : at + 16])!r}"
        )
    mask = [int(m) for m in enc["assistant_masks"][len(prompt_ids) :]]
    if not any(mask) and any(m.get("role") == "assistant" for m in row[side]):
        raise ValueError(
            f"row {index} of the {dataset_name} dataset: {side} holds an assistant message but the chat template "
            "marks none of its tokens: the template needs {% generation %} ... {% endgeneration %} around each "
            "assistant message (as engine/export/training.py's CHAT_TEMPLATE has)"
        )
    return mask


def _add_assistant_masks(
    batch: dict[str, list], indices: list[int], processing_class, sides: tuple[str, ...], dataset_name: str
) -> dict[str, list]:
    """A batched ``map`` function: each side's assistant mask, and the KL completions' as TRL rotated them."""
    rows = [{key: values[r] for key, values in batch.items()} for r in range(len(indices))]
    out: dict[str, list] = {}
    for side in sides:
        out[_mask_column(side)] = [
            _side_mask(processing_class, row, side, i, dataset_name) for row, i in zip(rows, indices, strict=True)
        ]
    if "KL_completion_ids" in batch:
        # TRL pairs each prompt with the previous row's completion, within batches of this map's batch size
        # (KTOTrainer._prepare_dataset's add_kl_completion_ids): the masks rotate the same way.
        ids = batch["completion_ids"]
        if [ids[-1], *ids[:-1]] != batch["KL_completion_ids"]:
            raise ValueError(
                f"rows {indices[0]}-{indices[-1]} of the {dataset_name} dataset: KL_completion_ids are not the "
                "completions rotated by one within the batch, so their assistant masks cannot be derived"
            )
        masks = out[_mask_column("completion")]
        out[_mask_column("KL_completion")] = [masks[-1], *masks[:-1]]
    return out


class _AssistantOnly:
    """What AssistantOnlyDPOTrainer and AssistantOnlyKTOTrainer add to TRL's trainers (the module's docstring)."""

    _sides: tuple[str, ...] = ()

    @property
    def data_collator(self):
        return self.__dict__.get("_assistant_only_collator")

    @data_collator.setter
    def data_collator(self, collator) -> None:
        # Trainer.__init__ sets it, before TRL's precompute of reference log-probs uses it.
        if collator is not None and not isinstance(collator, AssistantOnlyCollator):
            collator = AssistantOnlyCollator(collator, self._sides)
        self.__dict__["_assistant_only_collator"] = collator

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        from datasets import Dataset
        from trl.trainer.utils import global_then_local_main_first

        dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        map_kwargs: dict[str, Any] = {}
        if isinstance(dataset, Dataset):  # IterableDataset.map takes neither
            map_kwargs = {"num_proc": args.dataset_num_proc, "desc": f"Marking assistant tokens of {dataset_name}"}
        with global_then_local_main_first():
            # The batches (and processes) of TRL's map that rotated the KL completions, so each batch here is one there.
            return dataset.map(
                _add_assistant_masks,
                batched=True,
                batch_size=args.per_device_train_batch_size,
                with_indices=True,
                fn_kwargs={"processing_class": processing_class, "sides": self._sides, "dataset_name": dataset_name},
                **map_kwargs,
            )

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        kl = [_mask_column("KL_completion")] if "completion" in self._sides else []
        for column in [_mask_column(side) for side in self._sides] + kl:
            if column not in self._signature_columns:
                self._signature_columns.append(column)


def _trainer_classes() -> dict[str, type]:
    from trl import DPOTrainer, KTOTrainer

    class AssistantOnlyDPOTrainer(_AssistantOnly, DPOTrainer):
        """TRL's DPOTrainer whose loss scores the assistant's tokens of ``chosen`` and ``rejected`` only."""

        _sides = ("chosen", "rejected")

    class AssistantOnlyKTOTrainer(_AssistantOnly, KTOTrainer):
        """TRL's KTOTrainer whose loss and KL term score the assistant's tokens of ``completion`` only."""

        _sides = ("completion",)

    classes = {"AssistantOnlyDPOTrainer": AssistantOnlyDPOTrainer, "AssistantOnlyKTOTrainer": AssistantOnlyKTOTrainer}
    for name, cls in classes.items():  # importable by name (pickle), as if defined at the module's top
        cls.__module__, cls.__qualname__ = __name__, name
    return classes
