"""Generation and lm-eval scoring never use the rows padding the vocabulary.

The model's table has 512 rows for the test tokenizer's 500 tokens. Its weights are set so the
12 padding rows get by far the largest logits for every input (the final norm's bias and the
padding rows of the tied table point the same way), as an untrained or badly trained model's
padding rows may. Then:

- greedy and sampled generation (temperature, top-k, top-p) give only real token ids;
- lm-eval log-likelihoods equal the log-softmax over the 500 real rows of the plain model's
  logits, computed here, and `is_greedy` is the argmax over those rows.
"""

from __future__ import annotations

import pytest
import torch

from megatron.data.tokenizers import make_tokenizer
from megatron.inference import InferenceModel, SamplingSettings, generate
from megatron.model import build_gpt
from megatron.parallel import ParallelTopology
from tests.tiny import HF_TOKENIZER, HF_VOCAB
from tests.unit.model.tiny import neox_args

PADDED = 512


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer("HFTokenizer", vocab_file=str(HF_TOKENIZER))


@pytest.fixture(scope="module")
def module():
    args = neox_args(vocab_size=PADDED, seq_length=32)  # tied embedding and head
    model = build_gpt(args).eval()
    params = dict(model.named_parameters())
    table = params["tied_modules.embed.word_embeddings.weight"]  # (512, h)
    with torch.no_grad():
        params[f"{args.num_layers + 3}.norm.bias"].fill_(3.0)  # GPT-NeoX: L + 3
        table[HF_VOCAB:] = 3.0  # padding rows: logit ~ 3 · sum(normed + 3) = 9 h, real ones ~ 0
    return model


def inference_model(module, vocab_size: int) -> InferenceModel:
    topology = ParallelTopology(1, 1, world_size=1)
    cpu = torch.device("cpu")
    return InferenceModel(module, module.args, topology, cpu, torch.float32, vocab_size)


def test_the_padding_rows_do_dominate_the_raw_logits(module):
    tokens = torch.randint(0, HF_VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        raw = module(tokens, torch.arange(8).expand(2, 8))
    assert raw.shape[-1] == PADDED and bool((raw.argmax(-1) >= HF_VOCAB).all())


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(temperature=1.0),
        dict(temperature=0.7, top_k=20),
        dict(temperature=1.3, top_p=0.95),
        dict(temperature=1.0, top_k=50, top_p=0.9),
    ],
)
def test_generation_never_chooses_a_padding_row(module, tokenizer, settings):
    model = inference_model(module, tokenizer.vocab_size)
    prompts = [[5, 17, 230], [61, 7, 12], [300, 2, 45]]
    chosen = SamplingSettings(maximum_tokens=8, eod=None, **settings)
    outputs = generate(model, prompts, chosen, generator=torch.Generator().manual_seed(1))
    tokens = [t for out in outputs for t in out.tokens]
    assert len(tokens) == 24 and max(tokens) < HF_VOCAB


def test_log_likelihoods_normalise_over_the_real_vocabulary(module, tokenizer):
    from megatron.evaluation.adapter import MegatronLM

    lm = MegatronLM(inference_model(module, tokenizer.vocab_size), tokenizer, batch_size=2)
    pairs = [([5, 6, 7], [8, 9]), ([11], [12, 13, 14]), ([20, 21], [22])]
    scored = lm._score_batch(pairs)
    for (context, continuation), (logprob, greedy) in zip(pairs, scored):
        tokens = torch.tensor([(context + continuation)[:-1]])
        with torch.no_grad():
            logits = module(tokens, torch.arange(tokens.shape[1])[None])[0, :, :HF_VOCAB]
        picked = logits.log_softmax(-1)[-len(continuation) :]  # (len(cont), 500)
        target = torch.tensor(continuation)
        expected = picked.gather(-1, target[:, None]).sum().item()
        assert logprob == pytest.approx(expected, abs=1e-4)
        assert greedy == bool((picked.argmax(-1) == target).all())


def test_the_real_vocabulary_must_fit_the_table(module):
    with pytest.raises(ValueError, match="vocab_size 600"):
        inference_model(module, 600)
