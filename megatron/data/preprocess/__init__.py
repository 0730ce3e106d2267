"""Preprocessing: text files -> tokens -> `.bin/.idx` datasets (the engine of
tools/preprocess_data.py and prepare_data.py)."""

from megatron.data.preprocess.encoder import PreprocessError
from megatron.data.preprocess.pipeline import PreprocessOptions, PreprocessSummary, preprocess

__all__ = ["PreprocessError", "PreprocessOptions", "PreprocessSummary", "preprocess"]
