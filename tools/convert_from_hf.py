"""Convert a Hugging Face GPT-NeoX, Llama, Mistral, Qwen2 or Qwen3 model directory into our
checkpoint at any tensor/pipeline layout (and, for Mixtral, any expert-parallel size).

    python tools/convert_from_hf.py --hf pythia-160m --output checkpoints/pythia \\
        --model-parallel-size 2 --pipe-parallel-size 2
    python tools/convert_from_hf.py --hf mixtral --output checkpoints/mixtral \\
        --model-parallel-size 2 --pipe-parallel-size 2 --expert-parallel-size 2
    python deepy.py train.py checkpoints/pythia/hf_import.yml my_data_and_training.yml

writes {output}/global_step0/ (with `latest`), the tokenizer when the directory has one, and
{output}/hf_import.yml: the model, layout and tokenizer keys plus `load: {output}` and
`finetune: true`, to put before the other config files of a run. --config files may add
settings (tokenizer, ...); any model key they set must agree with the Hugging Face config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the imports below import DeepSpeed: it need not guess

from megatron.checkpoint_tools import import_hf  # noqa: E402
from megatron.config.verbosity import quiet_transformers  # noqa: E402
from megatron.errors import run_tool  # noqa: E402
from megatron.launcher.optional_packages import check_tool_packages  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hf", required=True, help="Hugging Face model directory (local)")
    p.add_argument("--output", required=True, help="save folder to write the checkpoint into")
    p.add_argument("--model-parallel-size", type=int, default=1, help="tensor-parallel size")
    p.add_argument(
        "--pipe-parallel-size",
        type=int,
        default=1,
        help="pipeline stages (0: plain engine, for ZeRO 2/3)",
    )
    p.add_argument(
        "--expert-parallel-size",
        type=int,
        default=1,
        help="moe_expert_parallel_size of the runs that load it (Mixtral; must divide its "
        "experts and the runs' data-parallel size)",
    )
    p.add_argument("--config", nargs="*", default=[], help="further config files (optional)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing global_step0")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_tool_packages(
        "convert_from_hf.py"
    )  # transformers and safetensors: not in the quick start
    quiet_transformers()
    result = import_hf(
        args.hf,
        args.output,
        tp=args.model_parallel_size,
        pp=args.pipe_parallel_size,
        ep=args.expert_parallel_size,
        config_files=args.config,
        overwrite=args.overwrite,
    )
    print(result.report())
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
