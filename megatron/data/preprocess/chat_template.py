"""Chat templates: a list of `{"role", "content"}` messages -> text pieces, one per turn.

Two kinds, chosen by `load_chat_template`:

* `ChatMLTemplate` (name `chatml`), the documented default when the tokenizer has no template of
  its own: every message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` and a reply is
  prompted by ``<|im_start|>assistant\\n`` (the ChatML layout that transformers used as its
  class-wide default template). Needs nothing but Python.
* `JinjaChatTemplate`: a Hugging Face template (the `chat_template` of a `tokenizer_config.json`,
  found next to an `HFTokenizer`'s `tokenizer.json`, or a `.jinja` file), rendered with jinja2 in
  the sandbox and with the variables transformers' `apply_chat_template` gives it.

`turns(messages)` splits the rendering at message boundaries the way GPT-NeoX's
`preprocess_data_with_chat_template.py` does: piece i is what rendering messages[:i + 1] adds to
the rendering of messages[:i], where a rendering ends with the reply prompt when the next message
is the assistant's. So the reply prompt belongs to the turn before the reply (it carries no loss)
and an assistant piece is the reply itself with its end-of-turn marker.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from megatron.data.preprocess.encoder import PreprocessError

ASSISTANT = "assistant"


class TemplateNotIncremental(ValueError):
    """Rendering the first i messages is not a prefix of rendering the first i + 1."""


class ChatTemplate:
    """Renders messages; `turns` cuts the rendering into one piece per message."""

    name = "template"

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        raise NotImplementedError

    def turns(self, messages: list[dict]) -> list[str]:
        pieces, done = [], ""
        for i in range(len(messages)):
            prompt_reply = i + 1 < len(messages) and messages[i + 1]["role"] == ASSISTANT
            text = self.render(messages[: i + 1], prompt_reply)
            if not text.startswith(done):
                raise TemplateNotIncremental(f"turn {i}")
            pieces.append(text[len(done) :])
            done = text
        return pieces


class ChatMLTemplate(ChatTemplate):
    name = "chatml"

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _token_text(value) -> str:
    """A special token of tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class JinjaChatTemplate(ChatTemplate):
    """A Hugging Face jinja chat template with its special tokens (bos_token, eos_token, ...)."""

    name = "jinja"

    def __init__(self, source: str, special_tokens: dict[str, str], origin: str):
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise PreprocessError(
                f"{origin}: rendering a Hugging Face chat template needs jinja2 "
                "(pip install jinja2), or pass --chat-template chatml"
            ) from None

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        # The environment transformers' apply_chat_template builds.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False,
                                                                  indent=indent)  # fmt: skip
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # Llama 3.x
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise PreprocessError(f"{origin}: chat template does not parse ({e})") from None
        self._special = special_tokens
        self.origin = origin

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self._special
        )

    @classmethod
    def from_tokenizer_config(cls, path: Path) -> JinjaChatTemplate | None:
        """The template of a tokenizer_config.json; None when it has none."""
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PreprocessError(f"--chat-template {path}: not readable JSON ({e})") from None
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: transformers uses "default"
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not source:
            return None
        special = {k: _token_text(v) for k, v in config.items() if k.endswith("_token")}
        return cls(source, special, str(path))


CHAT_TEMPLATES = {"chatml": ChatMLTemplate}


def load_chat_template(choice: str | None, vocab_file: str | None) -> ChatTemplate:
    """The template named or pointed to by `choice` (--chat-template): `chatml`, a
    tokenizer_config.json or a .jinja file. Without one: the `chat_template` of the
    tokenizer_config.json next to `vocab_file` (an HF tokenizer.json) if it has one, else ChatML."""
    if choice in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[choice]()
    if choice:
        path = Path(choice)
        if not path.is_file():
            valid = ", ".join(CHAT_TEMPLATES)
            raise PreprocessError(
                f"--chat-template {choice}: no such file; give {valid}, a tokenizer_config.json "
                "or a .jinja file"
            )
        if path.suffix == ".json":
            template = JinjaChatTemplate.from_tokenizer_config(path)
            if template is None:
                raise PreprocessError(f"--chat-template {path}: has no `chat_template`")
            return template
        return JinjaChatTemplate(path.read_text(encoding="utf-8"), {}, str(path))
    if vocab_file:
        config = Path(vocab_file).with_name("tokenizer_config.json")
        if config.is_file():
            template = JinjaChatTemplate.from_tokenizer_config(config)
            if template is not None:
                return template
    return ChatMLTemplate()
