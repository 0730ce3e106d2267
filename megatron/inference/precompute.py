"""`generate.py` with `text_gen_type: precompute`: the starting model's per-token log-probs of
every dataset the run reads, written beside each as GPT-NeoX names them,
`{prefix}_{precompute_model_name}` (float32 `.bin/.idx`, the sizes of the data).

    python deepy.py generate.py run.yml --set text_gen_type=precompute   # load: the SFT model

Value `k` of a document is `log p(token k+1 | tokens 0..k)`, the value the training samples
carry at input position `k` (a sample's `ref[:, :-1]` lines up with its labels); a document's
last value is 0 (its successor is another document). Each document is scored on its own, from
its first token, in windows of `seq_length` (a longer document restarts its context at every
window): exactly what the model computes for a sample that starts with the document, as every
`pack_impl: unpacked` sample does. Rows are shared out over data-parallel replicas, any tp/pp
layout scores them, and rank 0 writes the datasets in document order.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.indexed_writer import IndexedDatasetWriter
from megatron.data.sources import ref_prefix
from megatron.parallel import vocab_parallel_cross_entropy

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


def scored_prefixes(data) -> list[str]:
    """The token datasets the run reads (`cfg.data`): `data_path` or the explicit text paths
    with `dataset_impl: gpt2`, the pos and neg paths with `pairwise`; each once, in order."""
    if data.dataset_impl == "pairwise":
        keys = [f"{side}_{s}_data_paths" for s in SPLITS for side in ("pos", "neg")]
    elif data.train_data_paths:
        keys = [f"{s}_data_paths" for s in SPLITS]
    else:
        return [data.data_path] if data.data_path else []
    prefixes = [p for key in keys for p in getattr(data, key) or ()]
    return list(dict.fromkeys(prefixes))


def windows(n_tokens: int, seq_length: int) -> list[tuple[int, int]]:
    """(start, end) token spans scoring every position 0..n-2 of a document: spans of at most
    seq_length + 1 tokens, overlapping by one so each prediction is made once."""
    spans, start = [], 0
    while start < n_tokens - 1:
        end = min(start + seq_length + 1, n_tokens)
        spans.append((start, end))
        start = end - 1
    return spans


def score_rows(model, rows: list[np.ndarray], pad: int) -> list[np.ndarray]:
    """Log-prob of each next token, `len(row) - 1` values per row; collective over this model
    replica, the result on every rank of it."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)  # (b, s)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.as_tensor(row.astype(np.int64))
    positions = torch.arange(width).expand_as(tokens).contiguous()
    logits = model.forward(tokens, positions)  # (b, s, V) on the last stage, else None
    shape = (len(rows), width - 1)
    logps = None
    if logits is not None:
        # The next token of every position (the last one's, wrapped round, is dropped): the
        # cross entropy's chunked logsumexp gives log p(next) without a (b, s, V) log-softmax,
        # and over all s positions, so the logits are not sliced into a copy.
        following = tokens.roll(-1, dims=1).to(logits.device)  # (b, s)
        logps = -vocab_parallel_cross_entropy(logits, following)[:, :-1]  # (b, s - 1)
    logps = model.broadcast_from_last_stage(logps, shape, torch.float32).cpu().numpy()
    return [logps[i, : len(row) - 1] for i, row in enumerate(rows)]


def _rows(dataset: MMapIndexedDataset, seq_length: int):
    """(document, start, tokens) of every window of every document."""
    for doc in range(len(dataset)):
        tokens = dataset.get(doc)
        for start, end in windows(len(tokens), seq_length):
            yield doc, start, tokens[start:end]


def _is_writer(topology) -> bool:
    return topology.tp_rank == 0 and topology.pp_rank == 0


def precompute_dataset(model, dataset: MMapIndexedDataset, out_prefix: str, seq_length: int,
                       batch_size: int, pad: int) -> None:  # fmt: skip
    """Score `dataset` with `model` and write `out_prefix` (rank 0). Collective."""
    topo = model.topology
    rows = list(_rows(dataset, seq_length))
    per_round = batch_size * topo.dp_size
    values = {d: np.zeros(int(n), np.float32) for d, n in enumerate(dataset.sizes)}
    for first in range(0, len(rows), per_round):
        mine = rows[first + topo.dp_rank * batch_size :][:batch_size]
        scored = score_rows(model, [r[2] for r in mine], pad) if mine else []
        sent = [(d, s, v) for (d, s, _), v in zip(mine, scored)] if _is_writer(topo) else []
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sent)
        for part in everyone:
            for doc, start, v in part:
                values[doc][start : start + len(v)] = v
    if topo.rank == 0:
        with IndexedDatasetWriter(out_prefix, np.float32) as writer:
            for doc in range(len(dataset)):
                writer.add_document(values[doc])
        log.info("wrote reference log-probs of %d documents to %s", len(dataset), out_prefix)
    dist.barrier()


def precompute_from_config(cfg) -> list[str]:
    """Set up the model from `load` and write the reference log-probs of every dataset the
    run reads; returns the written prefixes."""
    from megatron.data import build_tokenizer
    from megatron.inference.model import InferenceModel
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything

    name = cfg.data.precompute_model_name
    if not name:
        raise ValueError(
            "text_gen_type: precompute writes {prefix}_{precompute_model_name}: set "
            "precompute_model_name (e.g. the starting model's name)"
        )
    prefixes = scored_prefixes(cfg.data)
    if not prefixes:
        raise ValueError("text_gen_type: precompute found no data paths to score in the config")
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    tokenizer = build_tokenizer(cfg)
    model = InferenceModel.from_config(cfg, topology, vocab_size=tokenizer.vocab_size)
    batch = cfg.training.train_micro_batch_size_per_gpu or 1
    written = []
    for prefix in prefixes:
        out = ref_prefix(prefix, name)
        dataset = MMapIndexedDataset(prefix)
        precompute_dataset(model, dataset, out, cfg.model.seq_length, batch, tokenizer.eod)
        written.append(out)
    return written
