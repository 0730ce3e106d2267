"""Pairwise datasets (GPT-NeoX's `dataset_impl: pairwise`), KTO rewards and precomputed
reference log-probs, read through the builders as `train.py` reads them."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from megatron.config.groups.data import DataConfig
from megatron.data.blendable_dataset import BlendableDataset
from megatron.data.builders import build_train_valid_test_datasets
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.pairwise_dataset import PairwiseDataset
from tests.unit.data.conftest import write_dataset
from tests.unit.data.test_packing import expected_samples, neox_pack_until_overflow

SEQ = 8
POS = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
NEG = [[21, 22], [23, 24, 25, 26, 27], [28, 29, 30], [31, 32]]


def _cfg(**data):
    return SimpleNamespace(
        data=DataConfig(data_impl="mmap", **data),
        model=SimpleNamespace(seq_length=SEQ, padded_vocab_size=None),
        training=SimpleNamespace(seed=5),
    )


def _labels(docs):
    return [[-100] + d[1:] for d in docs]  # the first token of each side is "prompt"


def _write_pairs(folder, name="p", pos=POS, neg=NEG, labels=True, refs=None):
    write_dataset(folder / f"{name}_pos", pos)
    write_dataset(folder / f"{name}_neg", neg)
    if labels:
        write_dataset(folder / f"{name}_pos_label", _labels(pos), dtype=np.int32)
        write_dataset(folder / f"{name}_neg_label", _labels(neg), dtype=np.int32)
    if refs:  # GPT-NeoX's name: the data prefix, "_", precompute_model_name
        for side, docs in (("pos", pos), ("neg", neg)):
            values = [[-0.5 * t for t in d] for d in docs]
            write_dataset(folder / f"{name}_{side}_{refs}", values, dtype=np.float32)
    return {side: str(folder / f"{name}_{side}") for side in ("pos", "neg")}


def _pair_cfg(folder, pack_impl="unpacked", **extra):
    p = _write_pairs(folder, refs=extra.get("precompute_model_name"))
    return _cfg(
        dataset_impl="pairwise", pack_impl=pack_impl, allow_chopped=True,
        pos_train_data_paths=[p["pos"]], neg_train_data_paths=[p["neg"]],
        pos_train_label_data_paths=[p["pos"] + "_label"],
        neg_train_label_data_paths=[p["neg"] + "_label"], **extra,
    )  # fmt: skip


def _pad(values, pad):
    return values[: SEQ + 1] + [pad] * (SEQ + 1 - len(values[: SEQ + 1]))


def test_unpacked_pairs_keep_sides_together_with_neox_keys(tmp_path):
    cfg = _pair_cfg(tmp_path, precompute_model_name="ref-model")
    train, _, _ = build_train_valid_test_datasets(cfg, [8, 0, 0])
    assert isinstance(train, PairwiseDataset)
    # GPT-NeoX's pairwise unpacked order: rows i % n_docs, shuffled by RandomState(seed)
    order = np.arange(int(np.ceil(8 * 1.005))) % 4
    np.random.RandomState(5).shuffle(order)
    for i in range(len(train)):
        s, d = train[i], int(order[i])
        assert set(s) == {"pos", "neg", "pos_label", "neg_label", "pos_ref", "neg_ref"}
        nxt = (d + 1) % 4  # the next document lends its first token, as GPT-NeoX reads
        assert s["pos"].tolist() == _pad(POS[d] + POS[nxt][:1], 0)
        assert s["neg"].tolist() == _pad(NEG[d] + NEG[nxt][:1], 0)
        assert s["pos_label"].tolist() == _pad(_labels(POS)[d] + [-100], -100)
        assert s["neg_label"].tolist() == _pad(_labels(NEG)[d] + [-100], -100)
        assert s["pos_ref"].dtype == np.float32
        assert s["pos_ref"].tolist() == _pad([-0.5 * t for t in POS[d] + POS[nxt][:1]], 0.0)
        assert s["neg_ref"].tolist() == _pad([-0.5 * t for t in NEG[d] + NEG[nxt][:1]], 0.0)


def test_pack_until_overflow_packs_by_the_longer_side(tmp_path):
    train, _, _ = build_train_valid_test_datasets(
        _pair_cfg(tmp_path, "pack_until_overflow"), [6, 0, 0]
    )
    sizes = [max(len(p), len(n)) for p, n in zip(POS, NEG)]
    n = len(train)
    groups, shuffle = neox_pack_until_overflow(sizes, lambda d, w: True, 4, n, SEQ, 5)
    pos = expected_samples(groups, shuffle, POS, _labels(POS), SEQ)
    neg = expected_samples(groups, shuffle, NEG, _labels(NEG), SEQ)
    for i in range(n):
        s = train[i]
        assert (s["pos"].tolist(), s["pos_label"].tolist()) == pos[i]
        assert (s["neg"].tolist(), s["neg_label"].tolist()) == neg[i]


def test_pairs_blend_by_weight_and_build_every_split(tmp_path):
    a, b = _write_pairs(tmp_path, "a"), _write_pairs(tmp_path, "b")
    cfg = _cfg(
        dataset_impl="pairwise", pack_impl="unpacked", allow_chopped=True,
        pos_train_data_paths=[a["pos"], b["pos"]], neg_train_data_paths=[a["neg"], b["neg"]],
        train_data_weights=[3.0, 1.0],
        pos_valid_data_paths=[b["pos"]], neg_valid_data_paths=[b["neg"]],
        pos_test_data_paths=[a["pos"]], neg_test_data_paths=[a["neg"]],
    )  # fmt: skip
    train, valid, test = build_train_valid_test_datasets(cfg, [40, 4, 4])
    assert isinstance(train, BlendableDataset) and len(train) == 40
    assert np.bincount(train.dataset_index).tolist() == [30, 10]
    assert isinstance(valid, PairwiseDataset) and isinstance(test, PairwiseDataset)
    assert set(train[0]) == {"pos", "neg", "pos_label", "neg_label"}  # labels: the tokens
    s = valid[0]
    assert ((s["pos_label"] == s["pos"]) | (s["pos_label"] == -100)).all()


def test_misaligned_pairs_are_refused_naming_both_files(tmp_path):
    p = _write_pairs(tmp_path, neg=NEG[:3], labels=False)
    pos, neg = MMapIndexedDataset(p["pos"]), MMapIndexedDataset(p["neg"])
    with pytest.raises(ValueError, match=r"p_pos has 4 documents but .*p_neg has 3"):
        PairwiseDataset("train", pos, neg, np.arange(4), 4, SEQ, 1)
    p = _write_pairs(tmp_path, "q")
    pos, neg = MMapIndexedDataset(p["pos"]), MMapIndexedDataset(p["neg"])
    with pytest.raises(ValueError, match="pack_impl: packed cannot pair"):
        PairwiseDataset("train", pos, neg, np.arange(4), 4, SEQ, 1, pack_impl="packed")
    label = MMapIndexedDataset(p["pos"] + "_label")
    with pytest.raises(ValueError, match=r"q_pos_label has no counterpart"):
        PairwiseDataset("train", pos, neg, np.arange(4), 4, SEQ, 1, pos_label=label)
    wrong = MMapIndexedDataset(p["neg"] + "_label")  # sizes of the other side
    with pytest.raises(ValueError, match=r"label dataset .*q_neg_label does not match .*q_pos"):
        PairwiseDataset("train", pos, neg, np.arange(4), 4, SEQ, 1, pos_label=wrong,
                        neg_label=label)  # fmt: skip


def test_missing_reference_logprobs_name_the_expected_file(tmp_path):
    cfg = _pair_cfg(tmp_path)
    cfg.data = replace(cfg.data, precompute_model_name="ref-model")
    with pytest.raises(FileNotFoundError, match=r"pos_train_data_paths\[0\].*p_pos_ref-model"):
        build_train_valid_test_datasets(cfg, [4, 0, 0])


def test_gpt_samples_carry_rewards_and_reference_logprobs(tmp_path):
    docs = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    write_dataset(tmp_path / "kto", docs)
    rewards = [[1.0] * 4, [-1.0] * 3, [1.0] * 5]
    write_dataset(tmp_path / "kto_reward", rewards, dtype=np.float32)
    refs = [[-0.1 * t for t in d] for d in docs]
    write_dataset(tmp_path / "kto_m", refs, dtype=np.float32)
    cfg = _cfg(
        train_data_paths=[str(tmp_path / "kto")],
        train_reward_data_paths=[str(tmp_path / "kto_reward")],
        precompute_model_name="m", pack_impl="unpacked", allow_chopped=True,
    )  # fmt: skip
    train, _, _ = build_train_valid_test_datasets(cfg, [6, 0, 0])
    for i in range(len(train)):
        s = train[i]
        assert s["reward"].dtype == np.float32 and s["ref"].dtype == np.float32
        d = next(k for k in range(3) if docs[k][0] == s["text"][0])
        n = len(docs[d])
        assert s["reward"][:n].tolist() == rewards[d] and s["reward"][n + 1 :].sum() == 0
        assert np.allclose(s["ref"][:n], refs[d]) and (s["label"][n + 1 :] == -100).all()
    write_dataset(tmp_path / "short_reward", rewards[:2], dtype=np.float32)
    cfg.data = replace(cfg.data, train_reward_data_paths=[str(tmp_path / "short_reward")])
    with pytest.raises(ValueError, match=r"reward dataset .*short_reward does not match"):
        build_train_valid_test_datasets(cfg, [6, 0, 0])


def test_data_path_split_reads_reference_logprobs_of_its_documents(tmp_path):
    docs = [[i + 1] * (i % 5 + 2) for i in range(20)]
    write_dataset(tmp_path / "d", docs)
    write_dataset(tmp_path / "d_m", [[float(t)] * len(t_) for t_ in docs for t in t_[:1]],
                  dtype=np.float32)  # fmt: skip
    cfg = _cfg(data_path=str(tmp_path / "d"), split="1,1", precompute_model_name="m")
    train, valid, _ = build_train_valid_test_datasets(cfg, [5, 5, 0])
    for ds in (train, valid):
        s = ds[0]
        assert s["ref"].tolist() == s["text"].astype(np.float32).tolist()


@pytest.mark.parametrize("pack_impl", ["unpacked", "pack_until_overflow"])
def test_a_pair_with_a_side_that_carries_no_loss_is_skipped(tmp_path, pack_impl):
    p = _write_pairs(tmp_path, labels=False)
    neg_labels = _labels(NEG)
    neg_labels[1] = [-100] * len(NEG[1])  # pair 1's rejected side: no token carries loss
    write_dataset(tmp_path / "pl", _labels(POS), dtype=np.int32)
    write_dataset(tmp_path / "nl", neg_labels, dtype=np.int32)
    ds = PairwiseDataset(
        "train", MMapIndexedDataset(p["pos"]), MMapIndexedDataset(p["neg"]), np.arange(4), 12,
        SEQ, 1, pack_impl=pack_impl, pos_label=MMapIndexedDataset(tmp_path / "pl"),
        neg_label=MMapIndexedDataset(tmp_path / "nl"),
    )  # fmt: skip
    served = [ds[i] for i in range(len(ds))]
    assert not any(NEG[1][1] in s["neg"] or POS[1][1] in s["pos"] for s in served)
    assert {d for d in range(4) if any(POS[d][1] in s["pos"] for s in served)} == {0, 2, 3}
