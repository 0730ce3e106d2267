"""Training-loop settings (`cfg.training`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingConfig:
    train_iters: int | None = None
    """Optimizer steps to train for."""

    train_epochs: int | None = None
    """Passes over the training data; sets `train_iters` from the dataset size when given."""

    train_batch_size: int | None = None
    """Global batch: micro batch × gradient accumulation × data-parallel size."""

    train_micro_batch_size_per_gpu: int | None = None
    """Samples per rank per forward/backward pass."""

    gradient_accumulation_steps: int | None = None
    """Micro batches accumulated per optimizer step."""

    seed: int = 1234
    """Random seed of initialisation, dropout and data order."""

    eval_interval: int = 1000
    """Evaluate on the validation split every this many iterations (0 disables)."""

    eval_iters: int = 100
    """Batches per evaluation."""

    eval_fixed_samples: bool = False
    """Every evaluation of the validation split reads the same samples (its first `eval_iters`
    global batches), so successive validation losses are comparable. By default, as in
    GPT-NeoX, each evaluation continues where the previous one stopped: new samples each time,
    and a loss that moves with the data as well as the model. The start-up report says which."""

    exit_interval: int | None = None
    """Save and exit when the iteration is a multiple of this."""

    do_test: bool = True
    """Evaluate on the test split at the end of training."""

    torch_compile: bool = False
    """Compile each transformer layer with `torch.compile` (inductor: Triton kernels on a GPU, C++
    on a CPU) for training; the layers share one compiled graph, built on the first step. Not a
    GPT-NeoX key. Same losses as eager up to float rounding, with either engine, activation
    checkpointing, tensor/sequence parallelism and ZeRO (stage 3 gains little). Refused with
    dropout, with the fused CUDA kernels and in bf16 on a CPU
    (`megatron/config/checks/torch_compile.py` says why). Generation, evaluation and export run
    eager."""
