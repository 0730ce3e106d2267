"""Preprocessing: text files -> tokens -> `.bin/.idx` datasets (the engine of
tools/preprocess_data.py and prepare_data.py). `main` is the command line. Post-training
records (chat, preference pairs, KTO) go through post_training.py (post_cli.py: the command
line of tools/preprocess_post_training.py)."""

from megatron.data.preprocess.cli import main
from megatron.data.preprocess.encoder import PreprocessError
from megatron.data.preprocess.pipeline import PreprocessOptions, PreprocessSummary, preprocess

__all__ = ["PreprocessError", "PreprocessOptions", "PreprocessSummary", "main", "preprocess"]
