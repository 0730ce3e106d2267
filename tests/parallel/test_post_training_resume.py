"""DPO and KTO through `pretrain` on 4 gloo ranks: a run stopped at step 3 and resumed repeats
the unbroken run bit for bit (fp32, dropout on), reference model included.

The policy starts from a language model's checkpoint (`finetune: true`), so the reference is
that checkpoint's weights; the resumed run points `load` at its own checkpoints, whose trainer
state records where the reference came from, so it must load the starting checkpoint again
(not the policy's newer weights). The KTO runs save into the starting checkpoint's own folder
with `keep_last_n_checkpoints: 1`, so pruning must spare the folder the reference reloads.
Layouts: DPO at (pp2, dp2), KTO at (tp2, dp2) on the plain
engine with ZeRO-1. Data: tiny character-level pairwise and reward datasets written here.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed import run_distributed
from tests.tiny import WORDS, resolve, tiny_settings

pytestmark = pytest.mark.slow


def _write(prefix, docs, dtype):
    from megatron.data import IndexedDatasetWriter

    with IndexedDatasetWriter(prefix, dtype) as writer:
        for doc in docs:
            writer.add_document(list(doc))
    return str(prefix)


def write_datasets(folder) -> dict:
    """Pairs: a prompt, then the real continuation (chosen) or its words reversed (rejected);
    KTO: the real (reward +1) or reversed (-1) completions; labels -100 on the prompt."""
    rng = np.random.RandomState(0)
    pos, neg, pos_label, neg_label, text, label, reward = ([] for _ in range(7))
    for i in range(48):
        words = list(rng.choice(WORDS, size=6))
        prompt = list((" ".join(words[:2]) + " ").encode())
        good = list(" ".join(words[2:]).encode()) + [0]
        bad = list(" ".join(reversed(words[2:])).encode()) + [0]
        pos.append(prompt + good)
        neg.append(prompt + bad)
        pos_label.append([-100] * len(prompt) + good)
        neg_label.append([-100] * len(prompt) + bad)
        completion = good if i % 2 == 0 else bad
        text.append(prompt + completion)
        label.append([-100] * len(prompt) + completion)
        reward.append([1.0 if i % 2 == 0 else -1.0] * len(text[-1]))
    p = folder / "data"
    p.mkdir(parents=True, exist_ok=True)
    files = dict(
        pos=_write(p / "pos", pos, np.uint16),
        neg=_write(p / "neg", neg, np.uint16),
        pos_label=_write(p / "pos_label", pos_label, np.int32),
        neg_label=_write(p / "neg_label", neg_label, np.int32),
        text=_write(p / "text", text, np.uint16),
        label=_write(p / "label", label, np.int32),
        reward=_write(p / "reward", reward, np.float32),
    )
    dpo = dict(dataset_impl="pairwise", pack_impl="unpacked", train_impl="dpo")
    kto = dict(pack_impl="unpacked", train_impl="kto")
    for split in ("train", "valid"):
        dpo.update(
            {
                f"pos_{split}_data_paths": [files["pos"]],
                f"neg_{split}_data_paths": [files["neg"]],
                f"pos_{split}_label_data_paths": [files["pos_label"]],
                f"neg_{split}_label_data_paths": [files["neg_label"]],
            }
        )
        kto.update(
            {
                f"{split}_data_paths": [files["text"]],
                f"{split}_label_data_paths": [files["label"]],
                f"{split}_reward_data_paths": [files["reward"]],
            }
        )
    return dict(dpo=dpo, kto=kto)


def _pretrain_all(rank, world_size, runs):
    from megatron.training import pretrain

    out = []
    for settings in runs:
        result = pretrain(resolve(settings, world_size))
        valid = result.valid.loss if result.valid else None
        metrics = result.valid.metrics if result.valid else None
        out.append(dict(losses=result.losses, valid=valid, metrics=metrics))
    return out


def test_dpo_and_kto_resume_exactly_with_the_starting_reference(tmp_path):
    data = write_datasets(tmp_path)
    layouts = {
        "dpo": dict(pipe_parallel_size=2, model_parallel_size=1),
        "kto": dict(pipe_parallel_size=0, model_parallel_size=2, zero_optimization={"stage": 1}),
    }
    runs = []
    for name, layout in layouts.items():
        start = tmp_path / name / "lm"
        runs.append(tiny_settings(start, train_iters=2, eval_interval=100, **layout))
        post = dict(data[name], data_path=None, load=str(start / "ckpt"), **layout)
        post.update(finetune=True, train_iters=6, eval_interval=6, eval_iters=1)
        runs.append(tiny_settings(tmp_path / name / "unbroken", **post))
        broken = dict(post, exit_interval=3)
        if name == "kto":  # saving where it started: keep_last_n must spare the reference's
            broken.update(save=post["load"], keep_last_n_checkpoints=1)  # global_step2
        runs.append(tiny_settings(tmp_path / name / "broken", **broken))
        resumed = dict(broken, load=broken.get("save", str(tmp_path / name / "broken" / "ckpt")))
        resumed.update(finetune=False, exit_interval=None)
        runs.append(tiny_settings(tmp_path / name / "broken", **resumed))
    results = run_distributed(_pretrain_all, 4, runs, timeout=1200)[0]
    for i, name in enumerate(layouts):
        _, unbroken, stopped, resumed = results[4 * i : 4 * i + 4]
        assert stopped["losses"] == unbroken["losses"][:3], name
        assert resumed["losses"] == unbroken["losses"][3:], name  # bitwise
        assert resumed["valid"] == unbroken["valid"] and resumed["metrics"] == unbroken["metrics"]
        assert "reward_acc" in unbroken["metrics"], name
        # the reference is the starting checkpoint: the first step compares equal weights (up
        # to the policy's dropout; the reference runs without), a loss of log 2 (DPO) or 1/2
        assert unbroken["losses"][0] == pytest.approx(0.6931472 if name == "dpo" else 0.5, abs=0.01)
