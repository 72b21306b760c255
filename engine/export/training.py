"""What a trainer needs beside the export's chat files: a chat template that renders them.

``CHAT_TEMPLATE`` (``chat_template.jinja`` beside this file) renders a chat sample -
system prompt, tools, user prompts, the assistant's reasoning, text and tool calls,
tool results - with the assistant messages inside ``{% generation %}`` markers, so
that ``apply_chat_template(..., return_assistant_tokens_mask=True)`` and TRL's
``assistant_only_loss`` count exactly the assistant's tokens. Its special tokens are
``SPECIAL_TOKENS``; ``<|end|>`` ends every message (the EOS a model learns to stop on).
A model with a chat template of its own (and generation markers) needs none of this.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (Path(__file__).with_name("chat_template.jinja")).read_text()
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|tools|>"]
EOS = "<|end|>"
PAD = "<|pad|>"
