"""The weight files a checkpoint folder holds for a model, and the two numberings in use.

Since issue 27 our layer list is GPT-NeoX's (`megatron/model/specs.py`): the pipeline engine
writes `layer_{i:02d}-model_{t:02d}-model_states.pt` for every layer that is a module
(`saved_layers`: 0, 2 .. L+1, L+3 and, untied, L+4) and tensor-parallel rank t, and the plain
engine the `module` of `mp_rank_{t:02d}_model_states.pt` in GPT-NeoX's sequential names
(`neox_layout.py`). `expected_layer_files` lists what a model needs, so a folder is compared
with the model before DeepSpeed opens it (its own loader stops on a bare assertion when a
layer file is missing).

Before issue 27 our checkpoints used another numbering (`OLD_NUMBERING`): index 1 held the
input positions, always as a file (empty unless the positions are learned, then
`position_embeddings.weight`), the final norm was L+2 and the head L+3; the plain engine's
`module` used the model's own names. GPT-NeoX never writes a layer 1 file and always writes
sequential names, so either marks the old numbering (`has_old_numbering`), and
`old_to_current` renames its tensors; the checkpoint tools read both, and
`tools/reshard.py` rewrites an old folder in the current numbering (the pre-flight names the
command).
"""

from __future__ import annotations

import re
from pathlib import Path

from megatron.checkpoint.deepspeed_files import LAYER_FILE, layer_file
from megatron.model.specs import gpt_layer_specs, layer_prefix, saved_layers

OLD_NUMBERING = "the layer numbering of our checkpoints before issue 27"


def expected_layer_files(args, tp: int) -> dict[int, list[str]]:
    """`{layer index: its file names, one per tensor-parallel rank}` the pipeline engine
    loads for the model `args` describes."""
    return {
        index: [layer_file(index, t) for t in range(tp)]
        for index in saved_layers(gpt_layer_specs(args))
    }


def migration(folder: Path) -> str:
    """Why a folder of `OLD_NUMBERING` is not loaded by the engine, and the tool that rewrites
    it in the current numbering (weights and optimizer state)."""
    return (
        f"{folder} was saved in {OLD_NUMBERING} (a layer_01 file, or a plain module in the "
        "model's own names), which the engine no longer loads; rewrite it in GPT-NeoX's "
        f"numbering with python tools/reshard.py --checkpoint {folder} --output <new folder> "
        "and this run's --model-parallel-size, --pipe-parallel-size and --zero-stage "
        "(deepy.py's pre-flight prints the whole command), then load the new folder"
    )


def layer_files_in(folder: Path) -> set[str]:
    return {p.name for p in Path(folder).iterdir() if LAYER_FILE.match(p.name)}


def has_old_numbering(folder: Path) -> bool:
    """Whether a pipeline checkpoint folder uses `OLD_NUMBERING` (it has a layer 1 file)."""
    return any(int(LAYER_FILE.match(name).group(1)) == 1 for name in layer_files_in(folder))


def old_layer_files(args, index: int) -> list[int]:
    """The layer indices of `OLD_NUMBERING` whose files hold current layer `index`'s
    tensors (under the same names inside the file); none for the two functions."""
    layers = args.num_layers
    moved = {0: [0, 1], 1: [], layers + 2: [], layers + 3: [layers + 2], layers + 4: [layers + 3]}
    return moved.get(index, [index])


_INDEX = re.compile(r"^(\d+)\.(.*)$")


def old_to_current(name: str, args) -> str:
    """A full parameter name of `OLD_NUMBERING` in the current numbering."""
    match = _INDEX.match(name)
    if match is None:  # the tied embedding's names did not change
        return name
    index, local = int(match.group(1)), match.group(2)
    if index == 1:  # the input positions moved into the embedding
        return layer_prefix(args, "embedding") + local
    moved = {args.num_layers + 2: args.num_layers + 3, args.num_layers + 3: args.num_layers + 4}
    return f"{moved.get(index, index)}.{local}"
