"""What `CheckpointIO.load` checks in a folder before DeepSpeed opens it, and what it reads from
a folder GPT-NeoX saved in place of our `trainer_state.pt`.

DeepSpeed's pipeline loader meets a missing layer file with a bare assertion
(`state_dict_factory.py`: `assert len(self.ckpt_list) > 0`) that names no file, and loads a
folder of our old layer numbering into the wrong layers; `check_model_files` names the file,
or the migration (`megatron/checkpoint/model_files.py`), first. `deepy.py`'s pre-flight checks
the same and more (shapes) before launch; this is the guard when it did not run
(`preflight_shared_fs: false`, or `train.py` started by hand).

A GPT-NeoX folder resumes from its own entries (`megatron/checkpoint/neox_resume.py`): the
iteration, its LR schedule, and its optimizer state when it fits our parameter groups; when it
does not, the load is refused with the reason rather than loading half.
"""

from __future__ import annotations

from pathlib import Path

from deepspeed.runtime.pipe.module import PipelineModule

from megatron.checkpoint.model_files import has_old_numbering, migration
from megatron.checkpoint.neox_resume import grouping_problem, neox_trainer_state, saved_groups
from megatron.checkpoint.safe_load import load_file


def check_model_files(engine, folder: Path) -> None:
    """Every layer file this pipeline stage loads is in `folder`, in the current numbering
    (the plain engine's module is checked as it loads, `neox_files.load_module`)."""
    module, missing = getattr(engine, "module", None), []
    if not isinstance(module, PipelineModule):
        return
    if has_old_numbering(folder):
        raise ValueError(migration(folder))
    for index, layer in enumerate(module.forward_funcs):
        if hasattr(layer, "load_state_dict") and not module.ckpt_layer_path_list(folder, index):
            missing.append(f"{Path(module.ckpt_layer_path(folder, index)).name} ({layer})")
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks the weights of layers the config's model builds on this stage: "
            f"{', '.join(missing)}. The folder is incomplete or was saved for another model "
            "(compare num_layers and no_weight_tying with the run that wrote it; "
            "tools/inspect_checkpoint.py lists what it holds)"
        )


def _our_groups(engine) -> list[list[str]]:
    """This rank's optimizer parameter groups as names: DeepSpeed's own record where it keeps
    one (ZeRO, its bf16 optimizer), else the torch optimizer's groups."""
    if engine.zero_optimization() or hasattr(engine.optimizer, "bf16_groups"):
        return [list(group) for group in engine._get_zero_param_shapes()]
    names = {id(p): n for n, p in engine.module.named_parameters()}
    groups = engine.basic_optimizer.param_groups
    return [[names.get(id(p), "?") for p in group["params"]] for group in groups]


def neox_resume_state(engine, folder: Path, load_optim: bool, tied: bool) -> dict:
    """Our trainer state from a GPT-NeoX folder (`neox_resume.py`); with `load_optim`, refuses
    optimizer state that does not fit this rank's parameter groups, with the reason."""
    state = neox_trainer_state(folder, engine.train_batch_size())
    if load_optim:
        path = Path(engine._get_ckpt_name(str(folder.parent), folder.name))
        saved = saved_groups(load_file(path, mmap=True), tied)
        problem = grouping_problem(saved, _our_groups(engine), str(path))
        if problem:
            raise ValueError(
                f"GPT-NeoX's optimizer state does not fit this run's: {problem}. Resume with "
                "no_load_optim: true (weights, iteration and LR schedule, a fresh optimizer) or "
                "finetune: true (the weights alone)"
            )
    return state
