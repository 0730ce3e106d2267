"""Post-training record formats: one jsonl record -> aligned token, label and reward documents.

Each format is a class in `POST_TRAINING_FORMATS`; `outputs` names the datasets it writes
(`{prefix}_{name}_document`, the naming of GPT-NeoX's configuration guide) and their kind:

* `chat` (SFT): ``{"messages": [{"role", "content"}, ...]}`` -> `text`, `text_label`;
* `pairs` (DPO, reward models): ``{"prompt", "chosen", "rejected"}``, all strings, or chosen and
  rejected as message lists (after a `prompt` message list, or complete conversations sharing
  their first messages) -> `text_pos`, `text_neg`, `text_pos_label`, `text_neg_label`;
* `kto`: ``{"prompt", "completion", "label": true|false}`` (strings, or message lists) ->
  `text`, `text_label`, `text_reward`.

Labels follow GPT-NeoX: a label document has the size of its text document and holds the token
id where a token carries loss, -100 where it does not. The reward document of a KTO record has
the same size too: +1 (desirable) or -1 (undesirable) as float32 on every token. GPT-NeoX's
GPT2Dataset reads a document's first reward value and repeats it over the sample's tokens, our
GPTDataset reads one value per token: both read this layout alike.

A document is the tokenization of its whole text (prompt and completion, or every rendered
chat turn); plain strings get the special tokens the tokenizer adds around a text (e.g. a BOS,
as preprocess_data.py's documents have them), rendered chats only those their template writes;
a token that spans the prompt/completion or a turn boundary belongs to the later
piece. Plain strings are joined verbatim: put any separator (a space, a newline) in them.
Every sequence ends with the tokenizer's EOD, which carries loss when the completion does (the
model learns to stop).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.data.preprocess.chat_template import ASSISTANT, ChatTemplate
from megatron.data.preprocess.encoder import UNTOKENIZABLE, missing_key

IGNORE_INDEX = -100  # GPT-NeoX's "no loss here" label

# Problem kinds of post-training records (the generic ones live in encoder.py).
NOT_A_MESSAGE_LIST = "not a list of {role: str, content: str} messages"
PAIR_FORMS_DIFFER = "chosen and rejected are not both strings or both message lists"
PAIR_NOT_ALIGNED = "chosen and rejected share no prompt"
PAIR_IDENTICAL = "chosen and rejected are identical"
NO_LOSS_TOKENS = "no token carries loss (no assistant turn or empty completion)"
TEMPLATE_REFUSED = "the chat template refused the messages"
TEMPLATE_NOT_INCREMENTAL = "chat template rendering is not turn by turn (prefix changes)"


def too_long(seq_length: int) -> str:
    return f"longer than --seq-length + 1 = {seq_length + 1} tokens"


def wrong_type(key: str, expected: str) -> str:
    return f"key {key!r} is not {expected}"


class RecordProblem(ValueError):
    """A record that cannot be used; `kind` is its line in the problem report."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


@dataclass
class SequenceBuilder:
    """Tokenizes pieces into (tokens, labels) with the run's tokenizer and label rules.

    `label_scope` "completion": loss on the completion / assistant turns (and the final EOD);
    "eod": loss only on the final EOD (GPT-NeoX's `--for-rm`, for reward models that read the
    score at the last token).
    """

    tokenizer: object
    template: ChatTemplate
    seq_length: int | None = None
    label_scope: str = "completion"

    def _ids(self, text: str, specials: bool) -> list[int]:
        tokenize = self.tokenizer.tokenize if specials else self.tokenizer.tokenize_without_specials
        try:
            return tokenize(text) if text else []
        except Exception:  # e.g. lone surrogates from a JSON escape
            raise RecordProblem(UNTOKENIZABLE) from None

    def sequence(self, pieces: list[tuple[str, bool]], specials: bool = True):
        """The ids of the whole text (as GPT-NeoX's chat preprocessing and transformers'
        apply_chat_template tokenize it, so SentencePiece's leading space and merges across
        pieces are those of the full text); piece i owns the ids that the text up to its end
        shares with the whole, so a token spanning a boundary belongs to the later piece.
        `specials`: with the special tokens the tokenizer adds around a text (BOS), as
        preprocess_data.py writes pretraining documents; a chat template writes its own."""
        tokens = self._ids("".join(text for text, _ in pieces), specials)
        labels: list[int] = []
        done = ""
        for i, (text, loss) in enumerate(pieces):
            done += text
            last = i + 1 == len(pieces)
            n = len(tokens) if last else common_prefix(self._ids(done, specials), tokens)
            owned = tokens[len(labels) : max(n, len(labels))]
            labels += owned if loss else [IGNORE_INDEX] * len(owned)
        eod = self.tokenizer.eod
        if not tokens or tokens[-1] != eod:
            tokens.append(eod)
            labels.append(eod if labels and labels[-1] != IGNORE_INDEX else IGNORE_INDEX)
        if self.label_scope == "eod":
            labels = [IGNORE_INDEX] * (len(tokens) - 1) + [eod if any(
                lab != IGNORE_INDEX for lab in labels) else IGNORE_INDEX]  # fmt: skip
        if all(lab == IGNORE_INDEX for lab in labels):
            raise RecordProblem(NO_LOSS_TOKENS)
        if self.seq_length is not None and len(tokens) > self.seq_length + 1:
            raise RecordProblem(too_long(self.seq_length))
        return tokens, labels

    def chat(self, messages: list[dict], first_loss_turn: int = 0):
        """(tokens, labels) of a conversation: loss on assistant turns from `first_loss_turn`."""
        pieces = self.template.turns(messages)
        loss = [m["role"] == ASSISTANT and i >= first_loss_turn for i, m in enumerate(messages)]
        return self.sequence(list(zip(pieces, loss)), specials=False)


def required(record: dict, key: str):
    if record.get(key) is None:
        raise RecordProblem(missing_key(key))
    return record[key]


def is_messages(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )


def messages(record: dict, key: str) -> list[dict]:
    value = required(record, key)
    if not isinstance(value, list) or not value or not is_messages(value):
        raise RecordProblem(f"key {key!r}: {NOT_A_MESSAGE_LIST}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def text_or_messages(record: dict, key: str):
    value = required(record, key)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return messages(record, key)
    raise RecordProblem(wrong_type(key, "a string or a message list"))


def common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class ChatFormat:
    name = "chat"
    outputs = {"text": "tokens", "text_label": "labels"}
    config_keys = {"text": "train_data_paths", "text_label": "train_label_data_paths"}

    def encode(self, record: dict, build: SequenceBuilder) -> dict[str, list]:
        tokens, labels = build.chat(messages(record, "messages"))
        return {"text": tokens, "text_label": labels}


class PairsFormat:
    name = "pairs"
    outputs = {
        "text_pos": "tokens",
        "text_neg": "tokens",
        "text_pos_label": "labels",
        "text_neg_label": "labels",
    }
    config_keys = {
        "text_pos": "pos_train_data_paths",
        "text_neg": "neg_train_data_paths",
        "text_pos_label": "pos_train_label_data_paths",
        "text_neg_label": "neg_train_label_data_paths",
    }

    def _sides(self, record: dict, build: SequenceBuilder):
        chosen, rejected = text_or_messages(record, "chosen"), text_or_messages(record, "rejected")
        if type(chosen) is not type(rejected):
            raise RecordProblem(PAIR_FORMS_DIFFER)
        if chosen == rejected:
            raise RecordProblem(PAIR_IDENTICAL)
        if isinstance(chosen, str):
            prompt = required(record, "prompt")
            if not isinstance(prompt, str):
                raise RecordProblem(wrong_type("prompt", "a string, as chosen and rejected are"))
            return [build.sequence([(prompt, False), (side, True)]) for side in (chosen, rejected)]
        prompt = record.get("prompt")
        if isinstance(prompt, list):
            prompt = messages(record, "prompt")
            chosen, rejected, shared = prompt + chosen, prompt + rejected, len(prompt)
        else:  # complete conversations (e.g. ultrafeedback_binarized): the shared start
            shared = common_prefix(chosen, rejected)
            if shared == 0 or (isinstance(prompt, str) and chosen[0]["content"] != prompt):
                raise RecordProblem(PAIR_NOT_ALIGNED)
        return [build.chat(side, first_loss_turn=shared) for side in (chosen, rejected)]

    def encode(self, record: dict, build: SequenceBuilder) -> dict[str, list]:
        (pos, pos_label), (neg, neg_label) = self._sides(record, build)
        return {"text_pos": pos, "text_neg": neg, "text_pos_label": pos_label,
                "text_neg_label": neg_label}  # fmt: skip


class KTOFormat:
    name = "kto"
    outputs = {"text": "tokens", "text_label": "labels", "text_reward": "reward"}
    config_keys = {
        "text": "train_data_paths",
        "text_label": "train_label_data_paths",
        "text_reward": "train_reward_data_paths",
    }

    def encode(self, record: dict, build: SequenceBuilder) -> dict[str, list]:
        desirable = required(record, "label")
        if not isinstance(desirable, bool):
            raise RecordProblem(wrong_type("label", "true or false"))
        prompt = text_or_messages(record, "prompt")
        completion = text_or_messages(record, "completion")
        if type(prompt) is not type(completion):
            raise RecordProblem(wrong_type("completion", "of the same form as 'prompt'"))
        if isinstance(prompt, str):
            tokens, labels = build.sequence([(prompt, False), (completion, True)])
        else:
            tokens, labels = build.chat(prompt + completion, first_loss_turn=len(prompt))
        reward = [1.0 if desirable else -1.0] * len(tokens)
        return {"text": tokens, "text_label": labels, "text_reward": reward}


POST_TRAINING_FORMATS = {f.name: f for f in (ChatFormat(), PairsFormat(), KTOFormat())}
