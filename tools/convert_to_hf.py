"""Export a checkpoint (any tp/pp layout) as a Hugging Face model directory.

    python tools/convert_to_hf.py --checkpoint checkpoints --output hf/my-model
    python tools/convert_to_hf.py --checkpoint checkpoints/global_step2000 \\
        --config configs/160M.yml local.yml --output hf/my-model --verify

writes config.json, generation_config.json, safetensors weights and the tokenizer files (when
the config's are found): GPTNeoXForCausalLM for GPT-NeoX/Pythia-style models, LlamaForCausalLM
for Llama-style ones (RMSNorm), or for those with QK-norm, q/k/v-only biases or a sliding
window Qwen3ForCausalLM, Qwen2ForCausalLM or MistralForCausalLM. A reward model (train_impl:
rm) becomes the same family's ...ForSequenceClassification (num_labels 1, its value head as
`score`, pad_token_id the end-of-text token so transformers reads the reward where we do). A
model the target architecture cannot express is refused, naming each option and its value,
before anything is written (exit status 2). Without
--config the config saved in the checkpoint describes the model.

--verify loads the result with transformers and compares its logits with ours; a difference
beyond --tolerance (relative to the largest logit) exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the imports below import DeepSpeed: it need not guess

from megatron.checkpoint_tools import (  # noqa: E402
    CheckpointReader,
    config_from_files,
    export_hf,
    verify_export,
)
from megatron.checkpoint_tools.hf_export import (  # noqa: E402
    ARCHITECTURES,
    DTYPES,
    VERIFY_TOLERANCE,
)
from megatron.config.verbosity import quiet_transformers  # noqa: E402
from megatron.errors import run_tool  # noqa: E402
from megatron.launcher.optional_packages import check_tool_packages  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="save folder (its latest) or global_stepN")
    p.add_argument("--config", nargs="*", default=[], help="config files (default: the saved one)")
    p.add_argument("--output", required=True, help="Hugging Face model directory to write")
    p.add_argument(
        "--architecture",
        default="auto",
        choices=ARCHITECTURES,
        help="auto: gpt_neox for LayerNorm models; for RMSNorm ones qwen3 (QK-norm), qwen2 "
        "(q/k/v-only biases), mistral (sliding window), else llama",
    )
    p.add_argument("--vocab-size", type=int, help="keep only this many vocabulary rows")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="weights dtype (default: as saved)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="load the result with transformers and compare logits with ours",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=VERIFY_TOLERANCE,
        help=f"--verify: largest accepted |logit difference| / max(1, largest |logit|) "
        f"(default {VERIFY_TOLERANCE:g})",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_tool_packages("convert_to_hf.py")  # transformers, safetensors: not in the quick start
    quiet_transformers()
    cfg = config_from_files(args.config) if args.config else None
    reader = CheckpointReader(args.checkpoint, cfg)
    state = reader.state_dict()
    eod = _eod(reader.cfg)
    result = export_hf(
        state,
        reader.args,
        args.output,
        architecture=args.architecture,
        vocab_size=args.vocab_size,
        dtype=args.dtype,
        tokenizer_cfg=reader.cfg.tokenizer,
        eod=eod,
        overwrite=args.overwrite,
    )
    print(f"read {reader.layout.folder} ({reader.layout.describe()})")
    print(result.report())
    if args.verify:
        check = verify_export(
            args.output, reader.args, state, dtype=args.dtype, tolerance=args.tolerance, eod=eod
        )
        print(check.report())
        if not check.ok:
            print(
                f"convert_to_hf.py: the export in {args.output} does not reproduce the "
                "checkpoint's logits; do not use it",
                file=sys.stderr,
            )
            return 1
    return 0


def _eod(cfg) -> int | None:
    from megatron.data.tokenizers import build_tokenizer

    try:
        return build_tokenizer(cfg).eod
    except Exception:  # noqa: BLE001 - the tokenizer files may not be on this machine
        return None


if __name__ == "__main__":
    sys.exit(run_tool(main))
