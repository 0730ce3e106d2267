"""A reward model (`train_impl: rm`) exported by `tools/convert_to_hf.py` from a checkpoint
saved at (tp=2, pp=2) loads in transformers as `...ForSequenceClassification`, whose scores
equal our rewards on the same sequences within 1e-5 (fp32).

Our rewards come from the training path: GPT-NeoX's reward-model samples (text, its
end-of-text token, then end-of-text padding; only that token labelled) through the rm
objective's `model_inputs` and `sequence_rewards`. transformers gets the same input tokens and
finds its reward token by itself (the last token that is not `pad_token_id`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.checkpoint_tools import ModelSchema, write_checkpoint
from megatron.checkpoint_tools.hf_import import RECORD_DEFAULTS
from megatron.config import config_from_dict
from megatron.model import ModelArgs, build_gpt, load_full_state_dict
from megatron.training.objectives.rm import RewardModel, sequence_rewards
from megatron.training.setup.batches import BatchSettings
from tests.tiny import HF_TOKENIZER, HF_VOCAB
from tests.unit.tools.test_hf_export import random_state

transformers = pytest.importorskip("transformers")

SEQ = 16
FAMILIES = {
    "GPTNeoXForSequenceClassification": dict(
        norm="layernorm", gpt_j_residual=True, rotary_pct=0.5, no_weight_tying=False
    ),
    "LlamaForSequenceClassification": dict(
        norm="rmsnorm",
        activation="swiglu",
        num_kv_heads=2,
        intermediate_size=96,
        no_weight_tying=True,
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        use_bias_in_mlp=False,
    ),
}


def reward_config(family_keys):
    keys = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=SEQ,
        pos_emb="rotary",
        train_impl="rm",
        dataset_impl="pairwise",
        pack_impl="unpacked",
        pos_train_data_paths=["prefs_text_pos_document"],
        neg_train_data_paths=["prefs_text_neg_document"],
        pos_train_label_data_paths=["prefs_text_pos_label_document"],
        neg_train_label_data_paths=["prefs_text_neg_label_document"],
        tokenizer_type="HFTokenizer",
        vocab_file=str(HF_TOKENIZER),
        **RECORD_DEFAULTS,
    )
    keys.update(family_keys)  # the family's keys (or a test's changes) win
    return config_from_dict(keys, vocab_size=HF_VOCAB)


def reward_checkpoint(folder, family_keys):
    cfg = reward_config(family_keys)
    args = ModelArgs.from_config(cfg)
    assert args.value_head
    state = random_state(args)
    write_checkpoint(
        folder,
        schema=ModelSchema(args),
        state=state,
        tp=2,
        pp=2,
        iteration=1,
        config_dict=cfg.to_dict(),
    )
    return args, state


def for_rm_samples(eod: int, lengths, gen):
    """`{"pos", "neg", ...}` of GPT-NeoX's --for-rm form, `lengths` = text lengths."""
    n = len(lengths)
    text = torch.full((n, SEQ + 1), eod, dtype=torch.long)
    label = torch.full((n, SEQ + 1), -100, dtype=torch.long)
    for i, length in enumerate(lengths):
        body = torch.randint(0, HF_VOCAB - 1, (length,), generator=gen)
        text[i, :length] = torch.where(body >= eod, body + 1, body)
        label[i, length] = eod
    half = n // 2
    return {
        "pos": text[:half],
        "neg": text[half:],
        "pos_label": label[:half],
        "neg_label": label[half:],
    }


@pytest.mark.parametrize("hf_class", sorted(FAMILIES))
def test_reward_model_exports_as_sequence_classification(tmp_path, hf_class, capsys):
    from megatron.data.tokenizers import make_tokenizer
    from tools import convert_to_hf as tool

    args, state = reward_checkpoint(tmp_path / "ckpt", FAMILIES[hf_class])
    out = tmp_path / "hf"
    assert (
        tool.main(["--checkpoint", str(tmp_path / "ckpt"), "--output", str(out), "--verify"]) == 0
    )
    printed = capsys.readouterr().out
    assert f"exported {hf_class}" in printed and printed.rstrip().endswith(": ok")

    eod = make_tokenizer("HFTokenizer", vocab_file=str(HF_TOKENIZER)).eod
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32)
    assert type(hf).__name__ == hf_class
    assert hf.config.num_labels == 1 and hf.config.pad_token_id == eod

    rm = RewardModel(SimpleNamespace(model=SimpleNamespace(z_loss=0.0)))
    sample = for_rm_samples(eod, [SEQ, 3, 9, 1, 12, SEQ - 1], torch.Generator().manual_seed(3))
    (tokens, positions), (_, mask) = rm.model_inputs(sample, BatchSettings())
    ours = build_gpt(args).eval()
    load_full_state_dict(ours, state)
    with torch.no_grad():
        rewards = sequence_rewards(ours(tokens, positions), mask)  # (6,)
        scores = hf.eval()(input_ids=tokens).logits  # (6, 1)
    assert scores.shape == (6, 1)
    err = (scores.squeeze(1) - rewards).abs().max().item()
    assert err <= 1e-5 * max(1.0, rewards.abs().max().item()), err


def test_generation_refuses_a_reward_model():
    from megatron.inference import InferenceModel

    cfg = reward_config(FAMILIES["LlamaForSequenceClassification"])
    with pytest.raises(ValueError, match="train_impl: rm builds a reward model"):
        InferenceModel.from_config(cfg, None, "any/checkpoint", vocab_size=HF_VOCAB)
