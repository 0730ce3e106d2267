"""Optimizers: the registry that builds the configured one (`optimizers.py`), the ones written
here (Lion, SM3, MADGRAD with decoupled weight decay, 1-bit Adam, DisTrO/DeMo) and the LR
schedules (`lr/`)."""

from megatron.training.optim.distro import Distro
from megatron.training.optim.lion import Lion
from megatron.training.optim.madgrad import MADGRAD
from megatron.training.optim.onebit_adam import OneBitAdam
from megatron.training.optim.sm3 import SM3

__all__ = ["MADGRAD", "SM3", "Distro", "Lion", "OneBitAdam"]
