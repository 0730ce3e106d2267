"""Logits of each Hugging Face family of issue 13 run at (tp=2, pp=2) on 4 gloo ranks, against
`transformers` in fp32.

The tiny random Mistral, Qwen2, Qwen3 and Mixtral models of
tests/e2e/test_generate_hf_families.py go through `tools/convert_from_hf.py` at (2, 2); one
4-rank session loads each checkpoint with its `hf_import.yml` into `InferenceModel` (the model
`generate.py` runs: the heads, the MLP and the vocabulary split over tensor-parallel ranks, the
layers over pipeline stages) and runs a probe longer than the windows: the last stage's logits
equal transformers' within 1e-5. (The unit tests rebuild the whole model from the (2, 2)
files instead; this runs the split model.)
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed import run_distributed
from tests.e2e.test_generate_hf_families import FAMILIES, WINDOW, random_hf_model
from tests.tiny import HF_VOCAB

pytestmark = pytest.mark.slow
PROBE = torch.randint(0, HF_VOCAB, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(5))


def _split_logits(rank, world_size, snippets):
    from megatron.config import config_from_dict
    from megatron.inference import InferenceModel
    from megatron.launcher.worker import initialize_distributed

    out = {}
    positions = torch.arange(PROBE.shape[1]).expand_as(PROBE)
    for family, snippet in snippets.items():
        settings = {**json.loads(snippet.read_text()), "train_micro_batch_size_per_gpu": 1}
        cfg = config_from_dict(settings, world_size=world_size, vocab_size=HF_VOCAB)
        model = InferenceModel.from_config(cfg, initialize_distributed(cfg), vocab_size=HF_VOCAB)
        logits = model.forward(PROBE, positions)  # None before the last stage
        out[family] = None if logits is None else logits.float()
    return out


def test_families_at_tp2_pp2_give_transformers_logits(tmp_path):
    from tools import convert_from_hf

    models, snippets = {}, {}
    for family in sorted(FAMILIES):
        folder = tmp_path / family
        models[family] = random_hf_model(family, folder / "hf")
        argv = ["--hf", str(folder / "hf"), "--output", str(folder / "ours"),
                "--model-parallel-size", "2", "--pipe-parallel-size", "2"]  # fmt: skip
        assert convert_from_hf.main(argv) == 0
        snippets[family] = folder / "ours" / "hf_import.yml"
    results = run_distributed(_split_logits, 4, snippets)
    for family, hf in models.items():
        last = [r[family] for r in results if r[family] is not None]
        assert len(last) == 2, family  # the two tensor-parallel ranks of the last stage
        with torch.no_grad():
            expected = hf(input_ids=PROBE).logits
        for logits in last:
            torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5, msg=family)
