"""A DeepSpeed-based, Megatron-style 3D-parallel trainer for GPT language models."""

__version__ = "0.1.0"
