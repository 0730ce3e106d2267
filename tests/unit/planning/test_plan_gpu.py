"""On a GPU: the plan's allocated peak against `torch.cuda.max_memory_allocated` of real
`deepy.py` runs (the peak each run's metrics.jsonl records), within 10%.

A model of 160M's widths and GPT-2's vocabulary, so the logits and the optimizer states weigh
as they do at scale, on synthetic tokens; the pipeline engine with bf16 at ZeRO 1 (160M.yml's
path) and the plain engine at ZeRO 0 with checkpointing. `bench/gpu_check.py` records the same
comparison for its 160M runs (`planned_allocated_gib` beside `max_memory_allocated_gib`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.data.embedded import gpt2_tokenizer_files
from megatron.planning.files import plan_files
from tests.distributed import free_port
from tests.tiny import tiny_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
REPO = Path(__file__).resolve().parents[3]
GPT2_VOCAB = 50257
WIDTHS = dict(num_layers=6, hidden_size=768, num_attention_heads=12, seq_length=1024,
              max_position_embeddings=1024, attention_config=[[["flash"], 6]],
              train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2,
              precision="bfloat16", hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip
RUNS = {
    "pipeline bf16 zero 1": dict(zero_optimization={"stage": 1}),
    "plain zero 0, checkpointing": dict(pipe_parallel_size=0, checkpoint_activations=True),
}


def _config(folder: Path, keys: dict) -> Path:
    vocab, merges = gpt2_tokenizer_files()
    settings = tiny_settings(folder, **WIDTHS, **keys, data_path=None, data_impl="dummy",
                             tokenizer_type="GPT2BPETokenizer", vocab_file=str(vocab),
                             merge_file=str(merges), num_gpus=1, master_port=free_port(),
                             train_iters=3, save=None, load=None, eval_interval=0)  # fmt: skip
    settings["distributed_backend"] = "nccl"
    path = folder / "run.yml"
    path.write_text(json.dumps(settings))
    return path


@pytest.mark.parametrize("name", list(RUNS))
def test_the_plan_is_the_gpus_peak(tmp_path, name):
    config = _config(tmp_path, RUNS[name])
    run = subprocess.run([sys.executable, "deepy.py", "train.py", str(config)], cwd=REPO,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").open()]
    measured = max(r["max_memory_allocated_gib"] for r in rows if "split" not in r)
    plan, _ = plan_files([str(config)], world_size=1, vocab_size=GPT2_VOCAB)
    planned = plan.heaviest.allocated / 2**30
    assert measured == pytest.approx(planned, rel=0.10), (measured, planned)
