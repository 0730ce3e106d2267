"""DisTrO / DeMo: decoupled momentum, exchanging only its fast components (Psyche's `Distro`).

DeMo (Peng, Quesnelle, Kingma 2024), with Psyche's defaults and names. Each data-parallel rank
keeps its own momentum `delta` and the engine does not all-reduce gradients (`attach_engine`).
Per parameter, with this rank's local gradient `g`:

    p     <- p × (1 - lr × weight_decay)               decoupled weight decay
    delta <- compression_decay × delta + lr × g
    q     =  the top `compression_topk` DCT coefficients of each `compression_chunk` chunk
             of delta (`distro_dct.py`)
    delta <- delta - IDCT(q)                           the residual stays local
    Q     =  q of every data-parallel rank (all-gathered; with `quantize_1bit`, each value
             travels as its sign, 1 bit), averaged where ranks picked the same coefficient
    p     <- p - lr × sign(IDCT(Q))                    sign descent, as DeMo and Psyche

Every rank decodes the same gathered bytes in the same order, so the replicas stay equal
bit for bit. The residual subtracts the unquantised `q` (as Psyche does). All of a step's
coefficients travel in one `all_gather` of bytes over the data-parallel group: indices in the
narrowest integer type, values as packed sign bits or in the parameter's dtype.

Under tensor parallelism each rank's shard is a tensor of its own: the exchange runs over the
data-parallel group only, between ranks that hold the same shard.

Checkpoints: `delta` differs from rank to rank, so `state_dict` (saved by DeepSpeed on data-
parallel rank 0 only) leaves it out and `rank_state_dict` holds it; `checkpoint/checkpoint_io.py`
saves that per rank (`save_rank_state`/`load_rank_state`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron.checkpoint.safe_load import load_file
from megatron.parallel.comm import all_gather_list
from megatron.training.optim.closure import closure_loss, params_with_grads
from megatron.training.optim.distro_dct import ChunkedDCT, index_dtype
from megatron.training.optim.onebit_adam import pack_signs, unpack_signs


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.clone().view(dtype)  # a copy: the slice may not be aligned for `dtype`


class Distro(torch.optim.Optimizer):
    """DeMo over the data-parallel `group` (None: one rank, nothing is exchanged)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        compression_decay: float = 0.999,
        compression_chunk: int = 64,
        compression_topk: int = 8,
        quantize_1bit: bool = True,
        group=None,
    ):
        if not 0.0 <= compression_decay <= 1.0:
            raise ValueError(f"Distro compression_decay must be in [0, 1], got {compression_decay}")
        integers = {"compression_chunk": compression_chunk, "compression_topk": compression_topk}
        for name, value in integers.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Distro {name} must be an integer >= 1, got {value!r}")
        if not isinstance(quantize_1bit, bool):
            raise ValueError(f"Distro quantize_1bit must be true or false, got {quantize_1bit!r}")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))
        self.decay, self.chunk, self.topk = compression_decay, compression_chunk, compression_topk
        self.quantize_1bit = quantize_1bit
        self.group = group
        self._dct: dict[tuple, ChunkedDCT] = {}

    def attach_engine(self, engine, group=None) -> None:
        """Switch the engine's data-parallel gradient all-reduce off (DeMo replaces it) and
        exchange over `group`. The pipeline engine has a flag of its own for its reduce step."""
        self.group = group
        engine.enable_backward_allreduce = False
        if hasattr(engine, "pipeline_enable_backward_allreduce"):
            engine.pipeline_enable_backward_allreduce = False

    def _transform(self, p: torch.Tensor) -> ChunkedDCT:
        key = (tuple(p.shape), p.dtype, p.device)
        if key not in self._dct:
            self._dct[key] = ChunkedDCT(p.shape, self.chunk, p.dtype, p.device)
        return self._dct[key]

    def _extract(self, p: torch.Tensor, group: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Decay, weight decay, momentum; the fast components (idx, values) leave `delta`."""
        lr, wd = group["lr"], group["weight_decay"]
        if wd:
            p.mul_(1.0 - lr * wd)
        state = self.state[p]
        if "delta" not in state:
            state["delta"] = torch.zeros_like(p)
        delta = state["delta"]
        delta.mul_(self.decay).add_(p.grad, alpha=lr)
        dct = self._transform(p)
        idx, values = dct.top_k(dct.encode(delta), self.topk)
        delta.sub_(dct.decode(dct.scatter(idx, values)))
        return idx, values

    def _wire(self, idx: torch.Tensor, values: torch.Tensor, p) -> list[torch.Tensor]:
        """What this rank sends for one parameter, as bytes."""
        sent_idx = idx.to(index_dtype(self._transform(p).chunk_elements))
        sent_values = pack_signs(values.reshape(-1)) if self.quantize_1bit else values
        return [_as_bytes(sent_idx), _as_bytes(sent_values)]

    def _unwire(self, buffer, offset, p, idx_like, values_like):
        """(idx, values, next offset) of parameter `p` from a rank's byte buffer; shapes as
        this rank's own `idx_like`, `values_like`."""
        dtype = index_dtype(self._transform(p).chunk_elements)
        n_idx = idx_like.numel() * dtype.itemsize
        idx = _from_bytes(buffer[offset : offset + n_idx], dtype).to(torch.int64)
        idx = idx.view(idx_like.shape)
        offset += n_idx
        if self.quantize_1bit:
            n_val = (values_like.numel() + 7) // 8
            signs = unpack_signs(
                buffer[offset : offset + n_val], values_like.numel(), values_like.dtype
            )
            values = signs.view(values_like.shape)
        else:
            n_val = values_like.numel() * values_like.element_size()
            values = _from_bytes(buffer[offset : offset + n_val], values_like.dtype)
            values = values.view(values_like.shape)
        return idx, values, offset + n_val

    def _gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        return all_gather_list(local, self.group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        sent = []  # (param, its group, idx, values) in parameter order, the same on every rank
        for group in self.param_groups:
            for p in params_with_grads(group):
                sent.append((p, group, *self._extract(p, group)))
        if not sent:
            return loss
        local = torch.cat([b for p, _, idx, val in sent for b in self._wire(idx, val, p)])
        received = [[] for _ in sent]
        for buffer in self._gather(local):
            offset = 0
            for i, (p, _, idx, val) in enumerate(sent):
                r_idx, r_val, offset = self._unwire(buffer, offset, p, idx, val)
                received[i].append((r_idx, r_val))
        for (p, group, _, _), pairs in zip(sent, received):
            dct = self._transform(p)
            idx = torch.cat([i for i, _ in pairs], dim=-1)  # every rank's picks, rank order
            values = torch.cat([v for _, v in pairs], dim=-1)
            update = dct.decode(dct.scatter(idx, values))
            p.add_(update.sign(), alpha=-group["lr"])
        return loss

    def state_dict(self):
        """Hyper-parameters only: the momenta are per rank (`rank_state_dict`)."""
        state = super().state_dict()
        state["state"] = {}
        return state

    def rank_state_dict(self) -> dict:
        """This rank's momenta, in parameter order (None for a parameter without one yet)."""
        params = [p for g in self.param_groups for p in g["params"]]
        return {"delta": [self.state[p].get("delta") if p in self.state else None for p in params]}

    def load_rank_state_dict(self, state: dict) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        deltas = state["delta"]
        if len(deltas) != len(params):
            raise ValueError(
                f"Distro rank state holds {len(deltas)} momenta for {len(params)} parameters: "
                "it was saved for a different model or parallel layout"
            )
        for p, delta in zip(params, deltas):
            if delta is not None:
                self.state[p]["delta"] = delta.to(device=p.device, dtype=p.dtype).clone()


def rank_state_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"optimizer_rank_state_{rank}.pt"


def save_rank_state(optimizer, folder: Path, rank: int) -> None:
    """Save this rank's own optimizer state, for optimizers that keep one (Distro)."""
    if hasattr(optimizer, "rank_state_dict"):
        torch.save(optimizer.rank_state_dict(), rank_state_file(folder, rank))


def load_rank_state(optimizer, folder: Path, rank: int) -> None:
    """Restore what `save_rank_state` wrote (after DeepSpeed's own load)."""
    if not hasattr(optimizer, "load_rank_state_dict"):
        return
    path = rank_state_file(folder, rank)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {type(optimizer).__name__} keeps optimizer state per rank and "
            f"{folder} has none for rank {rank} (saved by another optimizer or layout); use "
            "no_load_optim: true or finetune: true to start its state afresh"
        )
    optimizer.load_rank_state_dict(load_file(path))
