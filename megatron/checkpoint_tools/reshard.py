"""Reshard a checkpoint from one tensor/pipeline layout to another, offline.

    result = reshard_checkpoint("ckpt", "ckpt_tp1", tp=1, pp=1)
    print(result.report())

Model weights always move (merged to full tensors, split for the target ranks). The optimizer
state moves with them, element for element, from any ZeRO stage: without ZeRO from the torch
optimizer state in the `mp_rank` files (`optimizer_state.py`), with ZeRO 1-3 from DeepSpeed's
flat data-parallel partitions (`zero_state.py`), for the elementwise optimizers
(`optimizer_read.unmovable_reason`: Adam moments and step counts, SGD momentum, Lion, ...). For any
other optimizer, or fp16/bf16 with ZeRO, the result says it was dropped and why, naming the
optimizer, and the run resuming from it must set `no_load_optim: true`. Iteration, consumed
samples, LR schedule and the skipped-step counters carry over, so a resumed run continues
where the source stopped; the per-rank RNG states do not (with dropout, the masks after the
resume differ from an unbroken run's).

The output is written for the ZeRO stage of the run that resumes it (`zero_stage`), and
DeepSpeed loads it at any data-parallel size: that is how a run changes its number of ranks
(dp), its tp/pp layout or its ZeRO stage. Stage 0: module and torch optimizer state in the
`mp_rank` files. Stages 1-3: the weights in the ordinary model files and, beside them,
DeepSpeed's universal layout (`zero/`, `universal.py`), which its ZeRO optimizers restore
through `load_universal` (switched on by `CheckpointIO.load` for such a folder; ZeRO 3 at
tensor-parallel size 1 and with Adam only, see `universal.py`). A run at a stage the files
were not written for is refused by the pre-flight (`megatron/preflight/checkpoints.py`),
since DeepSpeed would silently start its optimizer afresh.

Why an offline tool and not a conversion inside `load`: it is written once and can be
inspected, the pre-flight can name the exact command, and the conversion needs no process
group of the old layout. Why not DeepSpeed's converter (`ds_to_universal.py`): it requires the
`universal_checkpoint_info` that Megatron-DeepSpeed models save and ours do not, and reads
ZeRO 1/2 partitions only; the partition reading follows its `zero_to_fp32.py` reconstruction
instead, and `universal.py` writes the converter's output layout from the full state.

Expert parallelism (`ep`, Mixture of Experts): the experts come back whole from every
expert-parallel rank's files (`CheckpointReader`, `experts.py`) and are written at the target's
`moe_expert_parallel_size` as training saves them, with their optimizer state (ZeRO 0 sources
and targets only: ZeRO partitions saved at ep > 1 are not read, a ZeRO target at ep > 1 is
refused). The default keeps the source's size.

The padded vocabulary stays the checkpoint's when the target tensor-parallel size divides it
(`megatron/config/derive.py::kept_padded_vocab`): padding logits are masked out of the loss,
so the model computes the same function, and the run resuming it keeps that size
(`megatron/training/setup/resume_vocab.py`). Otherwise it is re-derived for the target
(`make_vocab_size_divisible_by * tp`, from the tokenizer's size when its files are there):
zero rows are added, or trailing padding rows dropped, in the vocabulary tables and their
optimizer state.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from megatron.checkpoint_tools.experts import check_expert_parallel
from megatron.checkpoint_tools.optimizer_read import read_optimizer_state
from megatron.checkpoint_tools.reader import CheckpointReader
from megatron.checkpoint_tools.schema import ModelSchema, resize_vocab
from megatron.checkpoint_tools.stages import stage_bounds
from megatron.checkpoint_tools.universal import (
    resume_note,
    universal_files,
    universal_target_problem,
)
from megatron.checkpoint_tools.writer import write_checkpoint
from megatron.model import ModelArgs

log = logging.getLogger(__name__)


@dataclass
class ReshardResult:
    folder: Path
    source: str
    target: str
    optimizer: str
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [
            f"resharded {self.source} -> {self.target}",
            f"  written: {self.folder}",
            f"  optimizer state: {self.optimizer}",
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def tokenizer_vocab_size(cfg) -> int | None:
    """The tokenizer's vocabulary size, or None when its files cannot be loaded here."""
    from megatron.data.tokenizers import build_tokenizer

    try:
        return build_tokenizer(cfg).vocab_size
    except Exception as err:  # noqa: BLE001 - missing files only mean "unknown"
        log.info("tokenizer not loaded (%s); keeping the padded vocabulary size", err)
        return None


def target_config(cfg, tp: int, pp: int, zero_stage: int = 0, ep: int | None = None):
    """The source config at layout (tp, pp), ZeRO `zero_stage` and expert-parallel size `ep`
    (None: the source's), its padded vocabulary kept if `tp` divides it, else re-derived."""
    from megatron.config import kept_padded_vocab

    m = cfg.model
    vocab = tokenizer_vocab_size(cfg) or m.true_vocab_size  # None: unknown here
    padded = kept_padded_vocab(
        m.padded_vocab_size,
        vocab or m.padded_vocab_size,
        cfg.tokenizer.make_vocab_size_divisible_by,
        tp,
    )
    ep = cfg.moe.moe_expert_parallel_size if ep is None else ep
    dp = math.lcm(cfg.parallel.data_parallel_size or 1, ep)  # ep divides dp
    # The recorded config says the stage the files are written for: 0 (module and optimizer
    # in mp_rank files) or 1/2 (DeepSpeed's universal layout, `universal.py`).
    zero = {**(cfg.parallel.zero_optimization or {}), "stage": zero_stage}
    return cfg.replace(
        model_parallel_size=tp,
        pipe_parallel_size=pp,
        padded_vocab_size=padded,
        true_vocab_size=vocab,
        world_size=dp * tp * max(1, pp),
        data_parallel_size=dp,
        zero_optimization=zero,
        zero_stage=zero_stage,
        moe_expert_parallel_size=ep,
    )


def check_layout(schema: ModelSchema, tp: int, pp: int) -> None:
    """Raise a `ValueError` when the model cannot be laid out as (tp, pp)."""
    if tp < 1 or pp < 0:
        raise ValueError(
            f"model_parallel_size must be >= 1 and pipe_parallel_size >= 0: {tp}, {pp}"
        )
    schema.check_tp(tp)
    if pp > 1:
        bounds = stage_bounds(schema, pp, tp)
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(
                f"pipe_parallel_size {pp} leaves a pipeline stage without layers "
                f"(stage boundaries {bounds} with pipe_partition_method "
                f"'{schema.args.pipe_partition_method}'); use fewer stages"
            )


def reshard_checkpoint(
    source: str | Path,
    output: str | Path,
    *,
    tp: int,
    pp: int,
    optimizer: bool = True,
    overwrite: bool = False,
    zero_stage: int = 0,
    ep: int | None = None,
    cfg=None,
) -> ReshardResult:
    """Write `source` (a save folder or global_step folder) to `output` at layout (tp, pp),
    for a run with ZeRO `zero_stage` (0, or 1-3 through DeepSpeed's universal layout).
    `cfg`: the config of the run that saved it (default: its `config.json`; a folder GPT-NeoX
    saved has none)."""
    reader = CheckpointReader(source, cfg)
    cfg = target_config(reader.cfg, tp, pp, zero_stage, ep)
    ep = cfg.moe.moe_expert_parallel_size
    schema = ModelSchema(ModelArgs.from_config(cfg))
    check_layout(schema, tp, pp)
    check_expert_parallel(schema, ep)
    if zero_stage and ep > 1:
        raise ValueError(
            f"--zero-stage {zero_stage} at --expert-parallel-size {ep}: the tools write "
            "expert-parallel checkpoints without ZeRO only; use --zero-stage 0"
        )
    if zero_stage and (problem := universal_target_problem(zero_stage, tp, pp)):
        raise ValueError(f"--zero-stage {zero_stage} at tp={tp}, pp={pp}: {problem}")
    notes = []
    state = reader.state_dict()
    for name, spec in schema.params.items():
        if spec.is_vocab_table and state[name].shape[0] != spec.shape[0]:
            state[name] = resize_vocab(state[name], spec.shape[0])
    old_rows, new_rows = reader.args.vocab_size, schema.args.vocab_size
    if old_rows != new_rows:
        notes.append(f"padded vocabulary {old_rows} -> {new_rows} rows for tp={tp}")
    moved, why = read_optimizer_state(reader, zero_stage) if optimizer else (None, "not requested")
    engine = reader.engine_state()
    trainer = reader.trainer_state()
    iteration = reader.layout.iteration
    if iteration is None:
        iteration = int((trainer or {}).get("iteration", engine.get("global_steps", 0)))
    folder = write_checkpoint(
        output,
        schema=schema,
        state=state,
        tp=tp,
        pp=pp,
        iteration=iteration,
        config_dict=cfg.to_dict(),
        optimizer=None if zero_stage else moved,
        engine_state=engine,
        trainer_state=trainer,
        overwrite=overwrite,
        more_files=universal_files(reader, schema, state, moved, tp, pp, zero_stage),
        ep=ep,
    )
    notes.append("per-rank RNG states are not carried over (they belong to the old ranks)")
    source_zero = int(getattr(reader.cfg.parallel, "zero_stage", 0) or 0)
    notes.append(resume_note(zero_stage, moved is not None))
    target = f"tp={tp}, pp={pp}, ZeRO stage {zero_stage}"
    if reader.args.moe_num_experts > 1:
        target += f", moe_expert_parallel_size {ep}"
    opt_text = f"dropped: {why}; resume with no_load_optim"
    if moved is not None:
        keys = sorted({k for state in moved.per_param.values() for k in state})
        opt_text = f"converted from ZeRO stage {source_zero} ({', '.join(keys)})"
    source = f"{reader.layout.describe()}, ZeRO stage {source_zero}"
    return ReshardResult(folder, source, target, opt_text, notes)
