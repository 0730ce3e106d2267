"""A reward model (`train_impl: rm`) as a Hugging Face `...ForSequenceClassification` model.

Every family we export has one (`GPTNeoXForSequenceClassification`,
`LlamaForSequenceClassification`, Mistral, Qwen2, Qwen3, Mixtral): the causal model's body
under the same names (`gpt_neox.*`, `model.*`) and a `score` linear `(num_labels, h)` without
bias where the causal model has its `lm_head`. Our value head is exactly that with
`num_labels: 1` (`hf_names.VALUE_HEAD`).

Which token's score is the reward: transformers takes, in each row, the rightmost token that
is not `pad_token_id` (the last one when no pad token is set, batch size 1 only). Ours is the
token before the end-of-text token that ends a reward-model sequence (its only labelled token,
see `megatron/training/objectives/rm.py`). Exporting with `pad_token_id` = the end-of-text
token makes them the same: feed transformers the sequence with its end-of-text token (and any
right padding with it) and it reads the token before, as we do. Without a known end-of-text
token the export says so and leaves `pad_token_id` unset (then feed the text alone, one
sequence at a time).

`verify_reward_export` compares transformers' sequence-classification logits with our
rewards on random sequences of different lengths, right-padded with the end-of-text token.
"""

from __future__ import annotations

import torch

from megatron.model import HF_ARCHITECTURES, ModelArgs

SEQUENCE_CLASSIFICATION = "ForSequenceClassification"


def reward_class(arch: str) -> str:
    """The `transformers` class name of `arch`'s reward model; refused when it has none."""
    import transformers

    causal = HF_ARCHITECTURES[arch].hf_class
    name = causal.replace("ForCausalLM", SEQUENCE_CLASSIFICATION)
    if name == causal or not hasattr(transformers, name):
        raise ValueError(
            f"a reward model (train_impl: rm) exports as a sequence-classification model, and "
            f"transformers {transformers.__version__} has no {name} for {causal}; choose an "
            f"--architecture with one ({', '.join(sorted(HF_ARCHITECTURES))})"
        )
    return name


def reward_config(config, arch: str, eod: int | None) -> list[str]:
    """Turn the causal `config` into the reward model's, in place; returns notes to report."""
    config.architectures = [reward_class(arch)]
    config.num_labels = 1
    config.pad_token_id = eod
    config.tie_word_embeddings = False  # no output embedding to tie: `score` has one row
    if eod is None:
        return [
            "no end-of-text token known, so pad_token_id is unset: transformers then reads "
            "the reward at the last token, one sequence at a time (feed the text without "
            "its end-of-text token)"
        ]
    return [
        f"pad_token_id = {eod} (end-of-text): transformers reads the reward at the token "
        "before the end-of-text token, as training did"
    ]


def padded_probe(eod: int, rows: int, seq: int, vocab: int):
    """Random `(n, seq)` tokens without `eod`, each row ending in `eod` then `eod` padding,
    and each row's reward position (the token before its first `eod`)."""
    gen = torch.Generator().manual_seed(0)
    lengths = [max(1, seq - 1 - (3 * i) % (seq - 1)) for i in range(rows)]
    tokens = torch.full((rows, seq), eod, dtype=torch.long)
    for i, n in enumerate(lengths):
        body = torch.randint(0, vocab - 1, (n,), generator=gen)
        tokens[i, :n] = torch.where(body >= eod, body + 1, body)  # (n,) never eod
    return tokens, torch.tensor(lengths) - 1


def reward_difference(output, args: ModelArgs, ours: torch.nn.Module, eod: int | None, seq: int):
    """(max |score difference|, max |reward|) of transformers' model at `output` against
    `ours` (a built reward model, fp32)."""
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(output, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    if eod is None:  # one unpadded sequence: transformers reads the last token
        tokens = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0))
        at = torch.tensor([seq - 1])
    else:
        tokens, at = padded_probe(eod, 3, seq, vocab)
    positions = torch.arange(seq).expand_as(tokens)
    with torch.no_grad():
        theirs = hf(input_ids=tokens).logits.squeeze(-1)  # (n,)
        mine = ours(tokens, positions).gather(1, at[:, None]).squeeze(1)  # (n,)
    return (theirs - mine).abs().max().item(), mine.abs().max().item()
