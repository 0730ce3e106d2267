"""Checkpoint tools: read and write our checkpoints without a DeepSpeed engine, at any layout.

| module            | what it holds                                                          |
| ----------------- | ---------------------------------------------------------------------- |
| `layout`          | locate `global_step{N}`, tp/pp/ZeRO-3 from DeepSpeed's file names      |
| `schema`          | each parameter's full shape and tensor-parallel split (from the model) |
| `reader`          | `CheckpointReader`: full weights, engine and trainer state             |
| `writer`          | `write_checkpoint`: full weights (+ optimizer) at a target layout      |
| `experts`         | experts cut into / joined from expert-parallel slices (any ep)         |
| `stages`          | pipeline stage bounds, optimizer parameter numbering per stage         |
| `optimizer_state` | ZeRO-0 optimizer state by name, merged and re-split                    |
| `zero_state`      | ZeRO 1-3 optimizer state by name, from DeepSpeed's flat partitions     |
| `reshard`         | `reshard_checkpoint(src, dst, tp=, pp=, zero_stage=, ep=)`: any layout |
| `universal`       | DeepSpeed's universal layout (`zero/`), for ZeRO 1-3 targets at any dp |
| `master_weights`  | fp32 master weights from ZeRO 1-3 partitions (bf16 runs, ZeRO-3 at tp>1) |
| `hf_export`       | `export_hf`: GPTNeoXForCausalLM / LlamaForCausalLM directory           |
| `hf_reward`       | a reward model as `...ForSequenceClassification` (used by `hf_export`) |
| `hf_import`       | `import_hf`: a Hugging Face directory -> our checkpoint                |
| `reward_init`     | a reward model's starting checkpoint from a language model's           |
| `tokenizer_files` | tokenizer files to and from a Hugging Face directory                   |
| `summary`         | iteration, layout, config, shapes and norms (`inspect_checkpoint.py`)  |

The CLIs in `tools/` (`convert_to_hf.py`, `convert_from_hf.py`, `reshard.py`,
`inspect_checkpoint.py`, `init_reward_model.py`) are thin wrappers over these functions.
"""

from megatron.checkpoint_tools.hf_export import ExportResult, export_hf, verify_export
from megatron.checkpoint_tools.hf_import import ImportResult, import_hf
from megatron.checkpoint_tools.layout import CheckpointError, CheckpointLayout, read_layout
from megatron.checkpoint_tools.reader import CheckpointReader, config_from_files
from megatron.checkpoint_tools.reshard import ReshardResult, reshard_checkpoint
from megatron.checkpoint_tools.schema import ModelSchema, ParamSpec
from megatron.checkpoint_tools.summary import format_summary, summarize
from megatron.checkpoint_tools.writer import write_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointLayout",
    "CheckpointReader",
    "ExportResult",
    "ImportResult",
    "ModelSchema",
    "ParamSpec",
    "ReshardResult",
    "config_from_files",
    "export_hf",
    "format_summary",
    "import_hf",
    "read_layout",
    "reshard_checkpoint",
    "summarize",
    "verify_export",
    "write_checkpoint",
]
