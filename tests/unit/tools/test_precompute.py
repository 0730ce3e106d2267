"""`generate.py`'s `text_gen_type: precompute`: the written reference log-probs are the model's
own log-probs of each document (scored alone, unpadded, by a plain forward and torch's
log-softmax here), in GPT-NeoX's layout and naming, at any layout: one process, and four
(pp=2 x dp=2) writing the same values."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed import run_distributed
from tests.tiny import HF_VOCAB, arch_settings, resolve

DOCS = [[5, 17, 230, 41, 99], [3] * 1, list(range(10, 50)), [61, 7, 7, 12, 300, 2, 45, 460, 8]]


def _precompute(rank, world_size, settings, prefix):
    import torch

    from megatron.data.indexed_dataset import MMapIndexedDataset
    from megatron.inference import InferenceModel
    from megatron.inference.model import inference_config
    from megatron.inference.precompute import precompute_dataset, scored_prefixes
    from megatron.launcher.worker import initialize_distributed
    from megatron.model import build_model
    from megatron.parallel.random import seed_everything

    # the model as generate.py builds it: a head that writes logits
    cfg = inference_config(resolve(settings, world_size, vocab_size=HF_VOCAB))
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    module = build_model(cfg, topology)  # the same seeded full weights on every rank
    model = InferenceModel(
        module, module.args, topology, torch.device("cpu"), torch.float32, HF_VOCAB
    )
    assert scored_prefixes(cfg.data) == [prefix]
    precompute_dataset(model, MMapIndexedDataset(prefix), f"{prefix}_ref", 32, 1, 0)
    if world_size > 1:
        return None
    own = []
    for doc in DOCS:  # the whole document in one forward (the long one: its first 32 tokens)
        tokens = torch.tensor([doc[:33]])
        logits = model.forward(tokens, torch.arange(tokens.shape[1])[None])
        logp = torch.log_softmax(logits.double(), -1)[0, :-1]
        own.append(logp.gather(-1, tokens[0, 1:, None]).squeeze(-1).numpy())
    return own


def _written(prefix):
    from megatron.data.indexed_dataset import MMapIndexedDataset

    ref = MMapIndexedDataset(f"{prefix}_ref")
    assert ref.dtype == np.float32 and ref.sizes.tolist() == [len(d) for d in DOCS]
    return [ref.get(i) for i in range(len(DOCS))]


def test_written_logprobs_are_the_models_own_at_any_layout(tmp_path):
    from tests.unit.data.conftest import write_dataset

    prefix = str(tmp_path / "docs")
    write_dataset(prefix, DOCS)
    settings = arch_settings(tmp_path, "neox", tp=1, pp=1, load=None, save=None, data_path=prefix)
    (own,) = run_distributed(_precompute, 1, settings, prefix)
    alone = _written(prefix)
    for values, doc, expected in zip(alone, DOCS, own):
        assert values[-1] == 0.0  # the last token predicts nothing of this document
        n = min(len(doc) - 1, 32)
        assert values[:n] == pytest.approx(expected[:n], abs=1e-5)
    # the long document's second window restarts at token 32 (value 32 predicts token 33)
    assert np.all(alone[2][32:39] != 0) and np.all(alone[2][:39] < 0)

    settings.update(pipe_parallel_size=2)
    run_distributed(_precompute, 4, settings, prefix)
    for values, single in zip(_written(prefix), alone):
        assert values == pytest.approx(single, abs=1e-5)
