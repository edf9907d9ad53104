"""Tokenizer for the runtime: the ``tokenizers`` library, tokenizer_config.json and jinja2.

``transformers.AutoTokenizer`` is deliberately not used at runtime: it is slow to import and
pulls in much more than encode/decode/chat-template needs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer


def _token_text(value: Any) -> str | None:
    """Special tokens appear as strings or as ``{"content": ...}`` objects."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class TokenizerNotFound(FileNotFoundError):
    """The model directory has no tokenizer (token ids still work)."""


def load_backend(path: str | Path) -> HFTokenizer:
    """The directory's ``tokenizers`` tokenizer: ``tokenizer.json``, or a tiktoken BPE
    (``tiktoken.model``, as Kimi K2 and Moonlight ship) converted to one."""
    path = Path(path)
    tok_file = path / "tokenizer.json"
    if tok_file.is_file():
        return HFTokenizer.from_file(str(tok_file))
    from tokenspeed.runtime.tiktoken_vocab import TIKTOKEN_FILE, load_tiktoken_dir

    if (path / TIKTOKEN_FILE).is_file():
        return load_tiktoken_dir(path)
    raise TokenizerNotFound(f"{path} has no tokenizer.json (nor {TIKTOKEN_FILE})")


class Tokenizer:
    """Encode, decode and render chat templates the way the checkpoint's tokenizer does."""

    def __init__(
        self, tokenizer: HFTokenizer, config: dict[str, Any], chat_template: str | None
    ) -> None:
        self.backend = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.bos_token_id = self.backend.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self.backend.token_to_id(self.eos_token) if self.eos_token else None
        self._compiled: Any = None

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | Path | None = None) -> Tokenizer:
        """Load the tokenizer (``load_backend``) + ``tokenizer_config.json`` (+ a chat template
        file if any)."""
        path = Path(path)
        backend = load_backend(path)
        cfg_file = path / "tokenizer_config.json"
        config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = path / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        if chat_template is not None:
            p = Path(chat_template)
            template = p.read_text() if p.is_file() else str(chat_template)
        return cls(backend, config, template)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; BOS is added when the tokenizer config asks for it."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if (
            add_special_tokens
            and self.add_bos_token
            and self.bos_token_id is not None
            and (not ids or ids[0] != self.bos_token_id)
        ):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _template(self) -> Any:
        if self._compiled is None:
            if not self.chat_template:
                raise ValueError(
                    "this tokenizer has no chat template; pass one with --chat-template"
                )
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise ValueError(f"chat template error: {message}")

            def tojson(value: Any, indent: int | None = None, **_: Any) -> str:
                return json.dumps(value, indent=indent, ensure_ascii=False)

            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._compiled = env.from_string(self.chat_template)
        return self._compiled

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to the prompt text the model was trained on."""
        return self._template().render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> list[int]:
        """Chat prompt ids; special tokens come from the template itself, none are added."""
        text = self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **kwargs
        )
        return self.encode(text, add_special_tokens=False)
