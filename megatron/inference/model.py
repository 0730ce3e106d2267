"""The model for inference: built at the run's layout, weights from any checkpoint layout, and a
forward pass across pipeline stages that returns full-vocabulary logits.

    model = InferenceModel.from_config(cfg, topology, vocab_size=tokenizer.vocab_size)
                                                              # loads cfg.checkpointing.load
    logits = model.forward(tokens, position_ids)              # (b, s, V) on the last stage,
                                                              # None on the other stages
    logits = model.forward(tokens, position_ids, last_only=True)  # (b, 1, V): generation's
    ids = model.broadcast_from_last_stage(ids)                # the same tensor on every rank
                                                              # of this model replica

No DeepSpeed engine is involved: the layers of this rank's stage (`forward_funcs` of the
`PipelineModule`, or of the plain `GPTModel`) run one after the other; the activation goes to
the next stage with `torch.distributed.send` after a small header (tuple or tensor, shape),
because the boundary may fall after any layer. The last stage gathers the vocabulary-parallel
logits over tensor-parallel ranks and returns only the tokenizer's `vocab_size` rows: the
rows padding the table to `padded_vocab_size` are no tokens, so nothing downstream (sampling,
lm-eval's log-softmax) may ever see them. Scoring (lm-eval, precomputed log-probabilities)
reads every position; generation reads the last one only, and with `last_only=True` the output
head, the gather and the fp32 cast run for that position alone (a 2k prompt over a 50k
vocabulary would otherwise write a 400 MB fp32 tensor for one row of it).

Weights are read with `megatron.checkpoint_tools.CheckpointReader` (only this stage's layers),
so a checkpoint saved at any tp/pp loads at any other. The model is built without sequence
parallelism, dropout or activation checkpointing: the same weights, the eval-time function.
Every rank holds all experts of a Mixture-of-Experts model whatever `moe_expert_parallel_size`
says (`WholeExperts`): the reader joins the expert-parallel slices of any checkpoint, and no
expert all-to-all couples the data-parallel replicas, which decode different prompts and
stop at different steps.
"""

from __future__ import annotations

import logging

import torch

from megatron.checkpoint_tools import CheckpointReader
from megatron.checkpoint_tools.schema import resize_vocab
from megatron.model import ModelArgs, build_model, load_full_state_dict
from megatron.model.param_groups import keeps_fp32
from megatron.parallel.comm import all_gather_along, broadcast, recv, send

log = logging.getLogger(__name__)

HEADER_LEN = 6  # is_tuple, ndim, up to 4 dims
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def inference_config(cfg):
    """The run config with training-only behaviour switched off (same weights): the head
    writes logits (no fused loss), which generation and scoring read."""
    return cfg.replace(
        loss_chunk_tokens=0,
        sequence_parallel=False,
        checkpoint_activations=False,
        partition_activations=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def inference_device_and_dtype(cfg) -> tuple[torch.device, torch.dtype]:
    """The accelerator of this rank (CPU without one) and the weights' dtype there: the run's
    precision on a GPU, fp32 on the CPU (where half-precision matmuls are slow or missing)."""
    from deepspeed.accelerator import get_accelerator

    if not torch.cuda.is_available():
        return torch.device("cpu"), torch.float32
    return torch.device(get_accelerator().current_device_name()), DTYPES[cfg.precision.dtype]


def to_run_precision(module: torch.nn.Module, device, dtype) -> None:
    """Move `module` to `device` with its parameters in `dtype` and its buffers as built: what
    DeepSpeed's engine does to the model it trains (it casts parameters only). So ALiBi's
    slopes stay fp32, as in training, and a checkpoint scores the same here as in training's
    evaluation; bf16 slopes would round 2^-0.5 and the other odd powers, shifting the score
    bias of distant tokens. Parameters marked `keep_fp32` (Mamba's A_log and D under
    `mamba_selective_fp32_params`) stay fp32, as training keeps them."""
    module.to(device)
    for param in module.parameters():
        if param.is_floating_point() and not keeps_fp32(param):
            param.data = param.data.to(dtype)


class WholeExperts:
    """`topology` seen without expert parallelism (module docstring): `build_model` then
    gives every rank all the experts."""

    ep_group = None

    def __init__(self, topology):
        self._topology = topology

    def __getattr__(self, name):
        return getattr(self._topology, name)


class InferenceModel:
    """This rank's stage of the model, its topology, and the stage-to-stage forward."""

    def __init__(
        self, module: torch.nn.Module, args: ModelArgs, topology, device, dtype, vocab_size: int
    ):
        if not 0 < vocab_size <= args.vocab_size:
            raise ValueError(
                f"vocab_size {vocab_size} (the tokenizer's) must be in 1..{args.vocab_size}, "
                "the model's padded vocabulary"
            )
        if args.loss_chunk_tokens:
            raise ValueError(
                f"the model was built with loss_chunk_tokens {args.loss_chunk_tokens}: its head "
                "writes no logits (it hands its inputs to the fused loss); build it from "
                "inference_config(cfg), which sets loss_chunk_tokens: 0"
            )
        self.vocab_size = vocab_size  # the real vocabulary: padding rows are never returned
        self.module = module.eval()
        self.args = args
        self.topology = topology
        self.device = device
        self.dtype = dtype
        self.funcs = list(module.forward_funcs)

    @classmethod
    def from_config(
        cls, cfg, topology, checkpoint: str | None = None, *, vocab_size: int
    ) -> InferenceModel:
        """Build at `cfg`'s layout and load `checkpoint` (default: `cfg.checkpointing.load`);
        `vocab_size` is the tokenizer's (real) vocabulary."""
        path = checkpoint or cfg.checkpointing.load
        if not path:
            raise ValueError(
                "no checkpoint to generate from: set `load` to the run's save folder (or pass "
                "--set load=PATH to deepy.py)"
            )
        cfg = inference_config(cfg)
        if ModelArgs.from_config(cfg).value_head:
            raise ValueError(
                "train_impl: rm builds a reward model: its value head gives one score per "
                "token, not next-token logits, so it cannot generate or be evaluated as a "
                "language model; export it with tools/convert_to_hf.py (a "
                "...ForSequenceClassification) to score texts"
            )
        module = build_model(cfg, WholeExperts(topology))
        device, dtype = inference_device_and_dtype(cfg)
        load_weights(module, path, topology)
        to_run_precision(module, device, dtype)
        return cls(module, module.args, topology, device, dtype, vocab_size)

    # -- stage-to-stage transfer ---------------------------------------------------------
    def _send(self, output) -> None:
        tensor = output[0] if isinstance(output, tuple) else output
        header = [int(isinstance(output, tuple)), tensor.dim(), *tensor.shape]
        header += [0] * (HEADER_LEN - len(header))
        dst = self.topology.pp_ranks[self.topology.pp_rank + 1]
        send(torch.tensor(header, dtype=torch.long, device=self.device), dst)
        send(tensor.contiguous(), dst)

    def _recv(self, position_ids: torch.Tensor):
        src = self.topology.pp_ranks[self.topology.pp_rank - 1]
        header = torch.empty(HEADER_LEN, dtype=torch.long, device=self.device)
        recv(header, src)
        is_tuple, ndim, *shape = header.tolist()
        tensor = torch.empty(shape[:ndim], dtype=self.dtype, device=self.device)
        recv(tensor, src)
        return (tensor, position_ids) if is_tuple else tensor

    @torch.no_grad()
    def forward(
        self, tokens: torch.Tensor, position_ids: torch.Tensor, *, last_only: bool = False
    ) -> torch.Tensor | None:
        """`(b, s)` tokens and positions -> logits `(b, s, vocab_size)` (the real vocabulary,
        padding rows cut off) on the last stage, None elsewhere. Collective over this model
        replica (all stages, all tp).

        `last_only`: logits `(b, 1, vocab_size)` of the last position only, all generation
        reads. The hidden states are cut to that position before the output head (the last
        layer of the last stage, `specs.py`), so neither the head's matmul, nor the
        tensor-parallel all-gather, nor the fp32 copy ever runs over the whole sequence; the
        layers before the head see every position, so the logits are those of the full
        forward's last position."""
        tokens = tokens.to(self.device)
        position_ids = position_ids.to(self.device)
        topo = self.topology
        x = (tokens, position_ids) if topo.is_first_stage else self._recv(position_ids)
        funcs = self.funcs
        if topo.is_last_stage and last_only:
            funcs = funcs[:-1]  # the head runs below, on the last position
        for fn in funcs:
            x = fn(x)
        if not topo.is_last_stage:
            self._send(x)
            return None
        if last_only:
            # (s, b, h) hidden states (no sequence parallelism here) -> (1, b, h)
            x = self.funcs[-1](x[-1:])  # (b, 1, V/tp)
        logits = all_gather_along(x.float(), x.dim() - 1, topo.tp_group)  # (b, s, V padded)
        return logits[..., : self.vocab_size]  # (b, s, V)

    def broadcast_from_last_stage(self, tensor: torch.Tensor | None, shape, dtype) -> torch.Tensor:
        """`tensor` of the last stage's first tensor-parallel rank, on every rank of this
        model replica (others pass None, or anything, with its `shape` and `dtype`)."""
        topo = self.topology
        src = topo.ds_topology.get_rank(pipe=topo.pp_size - 1, data=topo.dp_rank, model=0)
        if topo.rank == src:
            out = tensor.to(device=self.device, dtype=dtype).contiguous()
        else:
            out = torch.empty(shape, dtype=dtype, device=self.device)
        if topo.pp_size * topo.tp_size > 1:
            broadcast(out, src, topo.get_model_parallel_group())
        return out


def load_weights(module: torch.nn.Module, path: str, topology) -> None:
    """Load this rank's parameters of `module` from the checkpoint at `path` (any layout)."""
    reader = CheckpointReader(path)
    names = [name for name, _ in module.named_parameters()]
    state = reader.state_dict(names)
    rows = module.args.vocab_size
    for name in names:
        spec = reader.schema.params[name]
        if spec.is_vocab_table and state[name].shape[0] != rows:
            log.warning(
                "%s: checkpoint vocabulary %d rows, this layout pads to %d",
                name,
                state[name].shape[0],
                rows,
            )
            state[name] = resize_vocab(state[name], rows)
    load_full_state_dict(module, state, topology.tp_group)
    if topology.rank == 0:
        log.info("loaded %s (%s)", reader.folder, reader.layout.describe())
