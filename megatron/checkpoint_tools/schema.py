"""The parameters of a model as checkpoints see them: full shape, tensor-parallel split, layer.

`ModelSchema(args)` builds the model once at tp = 1 on PyTorch's `meta` device (no memory, no
initialisation work) and records, in `named_parameters` order, each parameter's

- full name (`specs.py`: `{layer index}.{name in layer}`, `tied_modules.embed.*`),
- full shape, and the dim a tensor-parallel rank splits (`partition_dim`, None = replicated),
  read from the marks the tensor-parallel layers set (`megatron.parallel.params`),
- layer index in the spec list and the name inside that layer (DeepSpeed's per-layer files
  store `{name in layer}` only).

So merging and splitting shards follows the model's own layers, never a second table of rules.
With that, `shard`/`merge` convert between a full tensor and the `tp` contiguous chunks the
layers hold, and `resize_vocab` pads or trims the vocabulary tables to another padded size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from megatron.model import ModelArgs, build_gpt
from megatron.model.specs import EMBED_KEY, layer_index
from megatron.parallel import is_tensor_parallel

TIED_PREFIX = f"tied_modules.{EMBED_KEY}."
VOCAB_SUFFIXES = ("word_embeddings.weight", "final_linear.weight")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the full model."""

    name: str
    shape: tuple[int, ...]
    partition_dim: int | None
    """Dim split over tensor-parallel ranks; None when every rank holds the whole tensor."""
    layer: int
    """Index in the layer spec list (the tied embedding counts as layer 0)."""
    local: str
    """Name inside its layer, as DeepSpeed's `layer_XX-model_YY-model_states.pt` store it."""

    @property
    def is_vocab_table(self) -> bool:
        return self.name.endswith(VOCAB_SUFFIXES)


def _meta_model(args: ModelArgs) -> torch.nn.Module:
    plain = dataclasses.replace(
        args, pipe_parallel_size=0, sequence_parallel=False, checkpoint_activations=False
    )
    with torch.device("meta"):
        return build_gpt(plain)


def split_name(name: str) -> tuple[int, str]:
    """`(layer index, name inside the layer)` of a full parameter name."""
    if name.startswith(TIED_PREFIX):
        return 0, name[len(TIED_PREFIX) :]
    head, _, local = name.partition(".")
    if not head.isdigit() or not local:
        raise ValueError(
            f"parameter name '{name}' is not a model name: expected '{{layer}}.{{name}}' or "
            f"'{TIED_PREFIX}{{name}}'"
        )
    return int(head), local


class ModelSchema:
    """Every parameter of the model `args` describes (see the module docstring)."""

    def __init__(self, args: ModelArgs):
        self.args = args
        self.meta_model = _meta_model(args)
        self.params: dict[str, ParamSpec] = {}
        for name, p in self.meta_model.named_parameters():
            layer, local = split_name(name)
            dim = p.partition_dim if is_tensor_parallel(p) else None
            self.params[name] = ParamSpec(name, tuple(p.shape), dim, layer, local)

    @property
    def num_spec_layers(self) -> int:
        """Length of the layer spec list (`specs.py`: embedding, a function, layers, a function,
        final norm, head)."""
        return layer_index(self.args, "head") + 1

    def layer_params(self, layer: int) -> list[ParamSpec]:
        """Parameters stored in layer `layer`'s files (the tied embedding in layer 0's)."""
        return [spec for spec in self.params.values() if spec.layer == layer]

    def prefix(self, layer: int) -> str:
        """Full-name prefix of the parameters of layer `layer`."""
        if layer == 0 and self.args.tied_embeddings:
            return TIED_PREFIX
        return f"{layer}."

    def spec(self, name: str) -> ParamSpec:
        if name not in self.params:
            known = ", ".join(list(self.params)[:4])
            raise KeyError(f"'{name}' is not a parameter of this model (it has {known}, ...)")
        return self.params[name]

    def check_tp(self, tp: int) -> None:
        """Raise a `ValueError` naming every tensor that `tp` ranks cannot split evenly."""
        bad = [
            f"{s.name} {s.shape} (dim {s.partition_dim})"
            for s in self.params.values()
            if s.partition_dim is not None and s.shape[s.partition_dim] % tp
        ]
        if self.args.kv_heads % tp:
            bad.insert(0, f"num_kv_heads {self.args.kv_heads}")
        if bad:
            raise ValueError(
                f"model_parallel_size {tp} cannot split this model: {', '.join(bad[:4])} "
                "are not divisible by it; choose a tensor-parallel size that divides them"
            )

    def shard(self, name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s contiguous chunk of the full tensor (the tensor itself if replicated)."""
        dim = self.params[name].partition_dim if name in self.params else None
        if dim is None or tp == 1:
            return full
        return full.chunk(tp, dim=dim)[rank].clone()

    def merge(self, name: str, shards: list[torch.Tensor]) -> torch.Tensor:
        """The full tensor from the chunks of ranks 0..tp-1 (rank 0's copy if replicated)."""
        dim = self.params[name].partition_dim if name in self.params else None
        if dim is None or len(shards) == 1:
            return shards[0]
        return torch.cat(shards, dim=dim)


def resize_vocab(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """A vocabulary table (or its optimizer state) with `rows` rows: zero rows appended, or
    trailing (padding) rows dropped."""
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows].clone()
    pad = tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])
    return torch.cat((tensor, pad))  # (rows, h)
