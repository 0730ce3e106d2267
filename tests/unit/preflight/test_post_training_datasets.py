"""The datasets pre-flight check on post-training data: pos/neg pairs, their labels, rewards and
the reference log-probs `precompute_model_name` names, on real `.bin/.idx` pairs."""

from __future__ import annotations

import numpy as np

from megatron.data.indexed_writer import IndexedDatasetWriter
from megatron.preflight import ERROR, OK
from tests.unit.preflight.files import write_pair
from tests.unit.preflight.test_datasets import errors, findings


def write_values(prefix, like, dtype=np.float32, drop_last_token=False):
    """Per-token values for every document of the pair at `like`."""
    from megatron.data.indexed_dataset import MMapIndexedDataset

    sizes = MMapIndexedDataset(like).sizes
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for i, n in enumerate(sizes):
            n = n - 1 if drop_last_token and i == len(sizes) - 1 else n
            writer.add_document(np.full(int(n), -1, dtype))
    return prefix


def _pairs(tmp_path, neg_docs=5):
    pos = write_pair(tmp_path / "pos", num_docs=5, seed=1)
    neg = write_pair(tmp_path / "neg", num_docs=neg_docs, seed=2)
    keys = dict(dataset_impl="pairwise", pack_impl="unpacked")
    return pos, neg, dict(keys, pos_train_data_paths=[str(pos)], neg_train_data_paths=[str(neg)])


def test_whole_aligned_pairs_with_labels_and_references_pass(tmp_path):
    pos, neg, keys = _pairs(tmp_path)
    for side in (pos, neg):
        write_values(f"{side}_label", side, np.int32)
        write_values(f"{side}_ref", side)
    keys["pos_train_label_data_paths"] = [f"{pos}_label"]
    keys["neg_train_label_data_paths"] = [f"{neg}_label"]
    keys["precompute_model_name"] = "ref"
    found = findings(**keys)
    assert [f.level for f in found] == [OK] * 6
    assert any(f.message.startswith(f"precompute_model_name (pos_train_data_paths[0]): {pos}_ref")
               for f in found)  # fmt: skip


def test_pair_sides_with_different_document_counts(tmp_path):
    pos, neg, keys = _pairs(tmp_path, neg_docs=4)
    (message,) = errors(**keys)
    assert message.startswith(f"pos_train_data_paths[0]: {pos}: 5 documents, but ")
    assert f"neg_train_data_paths[0]: {neg} has 4" in message


def test_missing_reference_and_misaligned_reward(tmp_path):
    data = write_pair(tmp_path / "kto", num_docs=3)
    write_values(tmp_path / "kto_reward", data, drop_last_token=True)
    keys = dict(train_data_paths=[str(data)], train_reward_data_paths=[str(data) + "_reward"])
    (message,) = errors(**keys)
    assert message.startswith(f"train_data_paths[0]: {data}: document 2 has ")
    assert f"train_reward_data_paths[0]: {data}_reward has" in message
    found = findings(precompute_model_name="sft", **keys)
    (missing,) = [f for f in found if f.level == ERROR]
    assert missing.message.startswith(f"precompute_model_name (train_data_paths[0]): {data}_sft")
    write_pair(tmp_path / "kto_sft", num_docs=3)  # token ids, not log-probs
    found = findings(precompute_model_name="sft", **keys)
    (wrong,) = [f.message for f in found if f.level == ERROR]
    assert "reference log-probs must be floats, found uint16" in wrong
