"""Loaders of the local test tasks: `datasets`' json builder on the files beside this one, so
nothing is downloaded (works with HF_DATASETS_OFFLINE=1)."""

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def _load(name: str, **_):
    return datasets.load_dataset("json", data_files={"test": str(HERE / name)})


def load_mc(**kwargs):
    return _load("tiny_mc.jsonl", **kwargs)


def load_text(**kwargs):
    return _load("tiny_text.jsonl", **kwargs)


def load_gen(**kwargs):
    return _load("tiny_gen.jsonl", **kwargs)
