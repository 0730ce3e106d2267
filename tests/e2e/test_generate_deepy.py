"""`python deepy.py generate.py CONFIG` on 4 CPU ranks at (tp=2, pp=2): greedy generation from
an input file with the Llama-style model writes a jsonl whose tokens are the ones
`transformers`' `generate` gives on the exported model (which stops at the same
end-of-document token). The run says where the samples went and shows the first; a second
run with the same sample_output_file is refused before launch and the samples are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed import free_port
from tests.tiny import HF_VOCAB, REPO
from tests.unit.tools.tiny_checkpoints import trained

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow
TIMEOUT = 300
PROMPTS = ["The king rode out", "ships of many colours", "wine"]


def deepy(script: str, config: dict, folder, status: int = 0) -> str:
    path = folder / f"{script}.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "deepy.py", script, str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, out[-4000:]
    return out


def test_generate_py_at_tp2_pp2_gives_transformers_greedy_tokens(tmp_path):
    from tools import convert_to_hf

    run = trained()["llama"]
    step2 = run["folder"] / "ckpt" / "global_step2"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    samples = tmp_path / "samples.jsonl"
    config = dict(
        run["settings"],
        load=str(step2),
        save=None,
        num_gpus=4,
        master_port=free_port(),
        text_gen_type="input-file",
        sample_input_file=str(prompts),
        sample_output_file=str(samples),
        maximum_tokens=8,
        temperature=0.0,
    )
    out = deepy("generate.py", config, tmp_path)
    kept = samples.read_text()
    records = [json.loads(line) for line in kept.splitlines()]
    assert [r["context"] for r in records] == PROMPTS
    assert f"wrote 3 sample(s) to {samples}" in out
    assert f'first prompt: "{PROMPTS[0]}"' in out
    again = deepy("generate.py", config, tmp_path, status=2)  # refused before launch
    assert f"--set sample_output_file={tmp_path / 'samples-2.jsonl'}" in again
    assert samples.read_text() == kept and "Traceback" not in again

    hf_dir = tmp_path / "hf"
    assert convert_to_hf.main(["--checkpoint", str(step2), "--output", str(hf_dir)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    for record in records:
        assert record["prompt_tokens"] == tokenizer(record["context"]).input_ids
        with torch.no_grad():
            # The export keeps the padding rows of the vocabulary; ours never chooses them.
            out = hf.generate(
                torch.tensor([record["prompt_tokens"]]),
                max_new_tokens=8,
                do_sample=False,
                suppress_tokens=list(range(HF_VOCAB, hf.config.vocab_size)),
            )
        theirs = out[0, len(record["prompt_tokens"]) :].tolist()
        if theirs and theirs[-1] == hf.generation_config.eos_token_id:
            theirs = theirs[:-1]
        assert record["tokens"] == theirs, record["context"]
        assert record["text"] == tokenizer.decode(record["tokens"])
