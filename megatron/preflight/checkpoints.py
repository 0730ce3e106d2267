"""Pre-flight check of `load`: the checkpoint the run would resume holds this model.

Which folder is read is the loaders' own rule (`resume_tag`). A training run resumes what
`{load}/latest` names; without `latest` (or without the folder) it starts afresh, which is no
error. When `latest` names a missing or partial (no `complete` marker) folder, the loader takes
the newest complete checkpoint instead, with a warning; with none complete it refuses a
missing folder and trusts a partial one (written before markers, or by GPT-NeoX). `generate.py`
and `eval.py` read `load` with the checkpoint tools (`latest`, or a `global_step{N}` folder).

Only small files are read: the folder listing, `config.json` and no tensor. The model shapes
are compared through `ModelSchema` (the checkpoint tools' one definition of every parameter's
full shape, built on the `meta` device from the model code); the error names each model key
whose value differs, as `megatron/model/hf_config.py` classifies them (every `ModelArgs` field
not in `NEUTRAL` can change the weights or what they compute); a training run is compared with
the padded vocabulary it will build, the checkpoint's where the trainer keeps it
(`megatron/training/setup/resume_vocab.py`). A training run also needs the
checkpoint's layout: DeepSpeed loads only the tensor/pipeline layout it saved, ZeRO partitions
only at the data-parallel size and ZeRO-or-not they were saved with (a ZeRO engine given a
checkpoint without partitions would silently start its optimizer afresh); any other layout is
refused with the `tools/reshard.py` command that converts weights and optimizer state to a
checkpoint of the target layout (`moe_expert_parallel_size` too: each expert-parallel rank
loads only its own slice of the experts, `megatron/checkpoint/experts.py`) for the run's
ZeRO stage: ZeRO 0, or 1/2 in DeepSpeed's
universal layout, restored at any data-parallel size (`megatron/checkpoint_tools/reshard.py`;
`megatron/checkpoint_tools/universal.py::universal_target_problem` says which runs can).
A training run's folder of another model, on other data, of another LR schedule or already
finished is said first, in the user's keys (`megatron/preflight/resumed_run.py`).
At the run's layout the weight files themselves are compared with the model
(`megatron/preflight/checkpoint_files.py`), and a folder GPT-NeoX saved (no
`trainer_state.pt`) resumes from its own entries (`megatron/checkpoint/neox_resume.py`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from megatron.checkpoint.deepspeed_files import ZERO_OPTIM_FILE
from megatron.checkpoint.model_files import OLD_NUMBERING
from megatron.checkpoint.neox_resume import is_neox_checkpoint
from megatron.checkpoint_tools.experts import saved_expert_parallel_size
from megatron.checkpoint_tools.layout import (
    COMPLETE,
    LATEST,
    TRAINER_STATE,
    CheckpointError,
    locate,
    read_layout,
    resume_tag,
)
from megatron.checkpoint_tools.reader import load_saved_config
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.checkpoint_tools.universal import (
    is_universal,
    reshard_stage,
    universal_target_problem,
)
from megatron.config import Config, resumed_padded_vocab
from megatron.config.groups.model import recorded_intermediate_size
from megatron.config.resolve import is_training_script
from megatron.model import ModelArgs
from megatron.model.args import CONFIG_ONLY
from megatron.model.hf_config import NEUTRAL
from megatron.preflight.checkpoint_files import describe, file_problems, is_old_numbering
from megatron.preflight.findings import ERROR, OK, WARNING, Finding, register
from megatron.preflight.resumed_run import another_model, finished_finding, run_findings

NAME = "load"
# The config key a `ModelArgs` field is set by, where the names differ.
CONFIG_KEY = {field: key for key, field in CONFIG_ONLY.items()}
# Model fields that are a parallel layout: the layout rule judges them (generation reads any).
LAYOUT_FIELDS = frozenset({"moe_expert_parallel_size"})


def resume_folder(load: Path) -> tuple[Path | None, list[Finding]]:
    """The folder a training run resumes from `load` (None: a fresh start), and findings: the
    loader's own rule (`resume_tag`), its warnings and refusal turned into findings."""
    notes: list[str] = []
    try:
        tag = resume_tag(load, warn=notes.append)
    except FileNotFoundError as err:
        return None, [Finding(NAME, ERROR, str(err))]
    if tag is None:
        return None, [
            Finding(NAME, OK, f"no checkpoint under '{load}' (no {LATEST} file): fresh start")
        ]
    folder = load / tag
    if notes or (folder / COMPLETE).is_file():
        return folder, [Finding(NAME, WARNING, note) for note in notes]
    note = f"{folder} has no completion marker (a crash mid-save, or written before markers)"
    return folder, [Finding(NAME, WARNING, f"{note}; the loader trusts it, as no folder has one")]


def key_differences(saved: ModelArgs, wanted: ModelArgs, *, vocab: bool = True) -> list[str]:
    """'key saved vs config' for every model key (not `NEUTRAL`) whose values differ."""
    out = []
    for f in dataclasses.fields(wanted):
        a, b = getattr(saved, f.name), getattr(wanted, f.name)
        if f.name in NEUTRAL | LAYOUT_FIELDS or a == b or (f.name == "vocab_size" and not vocab):
            continue
        out.append((CONFIG_KEY.get(f.name, f.name), a, b))
    return [f"{key} {a!r}, the config says {b!r}" for key, a, b in out]


def shape_differences(saved: ModelArgs, wanted: ModelArgs, *, vocab: bool = True) -> list[str]:
    """Parameters whose full shape (or existence) differs between the two models."""
    have, want = ModelSchema(saved).params, ModelSchema(wanted).params
    out = []
    for name in sorted(set(have) | set(want)):
        a = have[name].shape if name in have else None
        b = want[name].shape if name in want else None
        if a and b and not vocab and want[name].is_vocab_table:
            a, b = a[1:], b[1:]  # the inference loader pads or trims vocabulary rows
        if a != b:
            out.append(f"{name} {a or 'absent'} vs {b or 'absent'}")
    return out


def _zero_dp(folder: Path) -> int:
    """Data-parallel ranks of a ZeRO 1-3 save (its partition files of model-parallel rank 0),
    0 when it has none (ZeRO stage 0: DeepSpeed loads it at any data-parallel size)."""
    found = (ZERO_OPTIM_FILE.match(f.name) for f in folder.iterdir())
    return sum(1 for m in found if m and int(m.group(2)) == 0)


def _expert_parallel(layout, cfg: Config) -> tuple[int, int] | None:
    """`(saved, the run's)` moe_expert_parallel_size, None for a model without experts."""
    if cfg.moe.moe_num_experts <= 1:
        return None
    return saved_expert_parallel_size(layout.folder), cfg.moe.moe_expert_parallel_size


def _layout_problem(layout, cfg: Config) -> str:
    """Why DeepSpeed cannot resume `layout` with `cfg` ("" when it can)."""
    p, c = cfg.parallel, cfg.checkpointing
    eps = _expert_parallel(layout, cfg)
    if eps and eps[0] != eps[1]:  # refused by the loader even for the weights alone
        return (
            f"its experts are split over moe_expert_parallel_size {eps[0]} ranks, the run has "
            f"{eps[1]}, and each expert-parallel rank loads only its own slice"
        )
    universal = is_universal(layout.folder)
    # A ZeRO-3 engine restores a universal folder only through it (weights and optimizer).
    weights_only = c.no_load_optim or c.finetune
    universal_z3 = universal and p.zero_stage == 3 and not weights_only
    if (layout.tp, layout.pp, layout.zero3 or universal_z3) != (
        p.model_parallel_size,
        p.pipe_parallel_size,
        p.zero_stage == 3,
    ):
        return "DeepSpeed loads only the tensor/pipeline layout (and ZeRO-3 or not) it saved"
    if weights_only:  # no partitions read
        return ""
    if universal:  # DeepSpeed's universal layout: any dp
        problem = universal_target_problem(p.zero_stage, p.model_parallel_size, layout.pp)
        return f"it is in DeepSpeed's universal layout, and {problem}" if problem else ""
    saved_dp, stage = _zero_dp(layout.folder), p.zero_stage
    if saved_dp and not stage:
        return "its optimizer state is in ZeRO partitions, which a run without ZeRO cannot read"
    if saved_dp and saved_dp != p.data_parallel_size:
        return (
            f"its ZeRO partitions are over {saved_dp} data-parallel ranks, the run has "
            f"{p.data_parallel_size}, and DeepSpeed does not repartition them"
        )
    if not saved_dp and stage:
        return (
            "it was saved without ZeRO, and a ZeRO engine would find no partitions and start "
            "its optimizer afresh (resume with zero_optimization stage 0, or no_load_optim)"
        )
    return ""


def _layout_finding(layout, cfg: Config, problem: str | None = None) -> Finding | None:
    """The refusal of `layout` (`problem`, else `_layout_problem`'s), with the command that
    converts the folder for this run."""
    problem = problem or _layout_problem(layout, cfg)
    if not problem:
        return None
    p = cfg.parallel
    want = (p.model_parallel_size, p.pipe_parallel_size)
    stage, why = reshard_stage(p.zero_stage, *want)
    target = f"--model-parallel-size {want[0]} --pipe-parallel-size {want[1]}"
    eps, saved_ep = _expert_parallel(layout, cfg), ""
    if eps:
        target += f" --expert-parallel-size {eps[1]}"
        saved_ep = f", moe_expert_parallel_size {eps[0]}"
        if eps[1] > 1 and stage:
            stage, why = 0, " (the tools write expert-parallel checkpoints without ZeRO only)"
    target += f" --zero-stage {stage}"
    if not layout.config_file.is_file():  # GPT-NeoX's folders: the tool needs the model
        target += " --config <the config files of the run that saved it>"
    dp = _zero_dp(layout.folder)
    saved_zero = f"ZeRO partitions over {dp} data-parallel rank(s)" if dp else "without ZeRO"
    if is_universal(layout.folder):
        saved_zero = "DeepSpeed's universal layout"
    return Finding(
        NAME,
        ERROR,
        f"{layout.folder} was saved at {layout.describe()}{saved_ep} ({saved_zero}); the "
        f"config has "
        f"model_parallel_size {want[0]}, pipe_parallel_size {want[1]}, zero_stage "
        f"{p.zero_stage}, data_parallel_size {p.data_parallel_size}: {problem}. Convert it "
        f"(weights and optimizer state): run python tools/reshard.py --checkpoint "
        f"{layout.folder} --output <new folder> {target} and load the new folder with "
        f"zero_optimization stage {stage}{why}",
    )


def _universal_key_finding(folder: Path, cfg: Config) -> Finding | None:
    """DeepSpeed's `checkpoint.load_universal`, set by hand, on a folder not in its universal
    layout: it would read the weights from nowhere (`CheckpointIO.load` switches it on by
    itself for a universal folder, so the key is never needed)."""
    if not (cfg.deepspeed.checkpoint or {}).get("load_universal") or is_universal(folder):
        return None
    return Finding(
        NAME,
        ERROR,
        f"checkpoint.load_universal is true, but {folder} is not in DeepSpeed's universal "
        "layout (no zero/optimizer_state.pt), which DeepSpeed would then fail to load; remove "
        "the key: train.py switches load_universal on by itself for a folder converted with "
        "tools/reshard.py --zero-stage 1 or 2",
    )


def _model_findings(layout, cfg: Config, training: bool) -> list[Finding]:
    if not layout.config_file.is_file():
        note = f"{layout.folder} has no config.json: its model shape is not checked"
        return [Finding(NAME, WARNING, note)]
    try:
        saved_cfg = load_saved_config(layout)
        if training:  # the trainer keeps the checkpoint's padding where it can
            padded = resumed_padded_vocab(cfg, saved_cfg.model.padded_vocab_size)
            cfg = cfg.replace(padded_vocab_size=padded)
        saved = ModelArgs.from_config(saved_cfg)
        # config.json records an unset intermediate_size as its number; compare like with like
        recorded = recorded_intermediate_size(cfg.to_dict())
        wanted = ModelArgs.from_config(cfg.replace(intermediate_size=recorded))
    except (ValueError, TypeError, KeyError) as err:
        note = f"model shape not checked: {layout.config_file} could not be read ({err})"
        return [Finding(NAME, WARNING, note)]
    shapes = shape_differences(saved, wanted, vocab=training)
    keys = key_differences(saved, wanted, vocab=training)
    if shapes and training and not cfg.checkpointing.finetune:  # another run: say so first
        return [another_model(layout.folder, keys or shapes, cfg)]
    if shapes:
        named = "; ".join(keys) or "no model key (see the tensors)"
        return [
            Finding(
                NAME,
                ERROR,
                f"{layout.folder} was saved with {named}: {len(shapes)} tensor(s) differ "
                f"({', '.join(shapes[:3])}{', ...' if len(shapes) > 3 else ''}); set these "
                "keys to the checkpoint's values or load a checkpoint of this model",
            )
        ]
    same = f"{layout.folder}: model shape matches, saved at {layout.describe()}"
    found = [Finding(NAME, OK, same)]
    if keys:
        note = f"{layout.folder} holds weights of this shape, saved with {'; '.join(keys)}"
        found.append(Finding(NAME, WARNING, note))
    if training and not cfg.checkpointing.finetune:
        found += run_findings(layout.folder, saved_cfg, cfg)
        found += [f for f in (finished_finding(layout.folder, cfg),) if f]
    return found


def _file_findings(layout, cfg: Config) -> list[Finding]:
    """The folder's weight files against the model the run builds (`checkpoint_files.py`)."""
    if cfg.moe.moe_num_experts > 1:  # each expert-parallel rank's files hold a slice
        return []
    if layout.zero3:  # DeepSpeed's partitioned zero_pp_rank files; no module file to read
        return []
    if is_old_numbering(layout.folder, layout.pipeline):
        problem = f"it is in {OLD_NUMBERING}, which the engine no longer loads"
        return [_layout_finding(layout, cfg, problem)]
    try:  # the padded vocabulary the trainer keeps, as `_model_findings` compares
        padded = load_saved_config(layout).model.padded_vocab_size
        cfg = cfg.replace(padded_vocab_size=resumed_padded_vocab(cfg, padded))
    except (CheckpointError, ValueError, TypeError, KeyError):
        pass  # no config.json (GPT-NeoX writes none): the config's own vocabulary
    args = ModelArgs.from_config(cfg)
    problems = file_problems(layout.folder, args, layout.tp, layout.pipeline)
    if not problems:
        return []
    return [
        Finding(
            NAME,
            ERROR,
            f"{layout.folder}'s weight files do not hold the model the config builds: "
            f"{describe(problems)}. Set the model keys (num_layers, hidden_size, "
            "no_weight_tying, ...) to those of the run that wrote it, or load a complete "
            "folder of this model",
        )
    ]


def _folder(cfg: Config, training: bool) -> tuple[Path | None, list[Finding]]:
    load = Path(cfg.checkpointing.load)
    if training:
        return resume_folder(load) if load.is_dir() else (None, [_fresh(load)])
    try:
        return locate(load), []
    except CheckpointError as err:
        return None, [Finding(NAME, ERROR, f"{err} (from load)")]


def _fresh(load: Path) -> Finding:
    return Finding(NAME, OK, f"'{load}' does not exist: fresh start")


@register(NAME, reads_worker_files=True)
def check_load(cfg: Config, script: str) -> list[Finding]:
    """The checkpoint in `load` (when the run would read one) fits the config's model."""
    c = cfg.checkpointing
    if not c.load:
        return []
    training = is_training_script(script)
    folder, findings = _folder(cfg, training)
    if folder is None:
        return findings
    resumable = (folder / TRAINER_STATE).is_file() or is_neox_checkpoint(folder)
    if training and not c.finetune and not resumable:
        return findings + [
            Finding(
                NAME,
                ERROR,
                f"{folder / TRAINER_STATE} is missing: {folder} is not a checkpoint of this "
                "trainer (or is incomplete); use finetune: true to load its weights only",
            )
        ]
    try:
        layout = read_layout(folder)
    except CheckpointError as err:
        return findings + [Finding(NAME, ERROR, str(err))]
    model = _model_findings(layout, cfg, training)
    if any(f.level == ERROR for f in model) and training and not cfg.checkpointing.finetune:
        return findings + model  # another run's folder: its layout is beside the point
    bad_layout = _layout_finding(layout, cfg) if training else None
    bad_key = _universal_key_finding(folder, cfg) if training else None
    bad = [f for f in (bad_layout, bad_key) if f]
    if training and bad_layout is None and not any(f.level == ERROR for f in model):
        bad += _file_findings(layout, cfg)  # config.json agrees, or there is none
    return findings + bad + model
