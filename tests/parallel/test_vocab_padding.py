"""The loss does not depend on vocabulary padding: the same model at tp=1 and at tp=2, whose
padded vocabularies differ (100 tokens padded to 104 rows at tp=1 and to 112 at tp=2, as
`make_vocab_size_divisible_by: 8` pads them), gives the same loss within 1e-6 relative and the
same gradients, and the padding rows get exactly zero gradient. The padding rows hold random
weights (logits that would take probability mass if the loss counted them), different at the
two sizes. The tp=1 loss is also checked against `F.cross_entropy` (and the PaLM z-loss) over
the first 100 logit columns, written out here. One spawn of 2 gloo ranks, for a tied
GPT-NeoX-style model with z-loss and an untied Llama-style one.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from megatron.checkpoint_tools.schema import ModelSchema
from megatron.model import build_gpt, full_state_dict, load_full_state_dict
from megatron.parallel import ParallelTopology
from tests.distributed import run_distributed
from tests.unit.model.tiny import MICRO_BATCH, SEQ, llama_args, neox_args

TOKENS, ROWS_TP1, ROWS_TP2 = 100, 104, 112
TOL = 1e-6


def _batches(seed: int):
    """Two micro-batches of token ids below `TOKENS`, with a loss mask."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        tokens = torch.randint(0, TOKENS, (MICRO_BATCH, SEQ + 1), generator=gen)
        positions = torch.arange(SEQ).expand(MICRO_BATCH, SEQ).contiguous()
        mask = (torch.rand(MICRO_BATCH, SEQ, generator=gen) > 0.2).float()
        out.append(((tokens[:, :-1], positions), (tokens[:, 1:].contiguous(), mask)))
    return out


def _with_rows(args, state: dict, rows: int, seed: int) -> tuple[dict, set[str]]:
    """`state` with its vocabulary tables cut to the tokens' rows and padded to `rows` with
    random ones, and the tables' names."""
    gen = torch.Generator().manual_seed(seed)
    tables = {n for n, spec in ModelSchema(args).params.items() if spec.is_vocab_table}
    out = dict(state)
    for name in tables:
        tokens = state[name][:TOKENS]
        padding = torch.randn(rows - TOKENS, *tokens.shape[1:], generator=gen) * 3
        out[name] = torch.cat([tokens, padding])
    return out, tables


def _loss_and_grads(model, batches, tp_group=None):
    loss = sum(model.loss_fn(model(*inputs), labels) for inputs, labels in batches) / 2
    loss.backward()
    return loss.item(), full_state_dict(model, tp_group, grads=True)


def _formula(model, batches, z_loss: float) -> float:
    """Masked mean cross entropy (+ z-loss) of the logits' first `TOKENS` columns."""
    total = 0.0
    with torch.no_grad():
        for inputs, (labels, mask) in batches:
            logits = model(*inputs)[..., :TOKENS].flatten(0, 1)
            ce = F.cross_entropy(logits, labels.flatten(), reduction="none")
            term = ce + z_loss * logits.logsumexp(-1).square()
            total += float((term * mask.flatten()).sum() / mask.sum())
    return total / len(batches)


def _tp2(rank, world_size, runs):
    topo = ParallelTopology(tp_size=2, pp_size=0)
    out = []
    for args, state, batches in runs:
        model = build_gpt(args, topo)
        load_full_state_dict(model, state, topo.tp_group)
        loss, grads = _loss_and_grads(model, batches, topo.tp_group)
        out.append((loss, {k: v.numpy() for k, v in grads.items()}))  # tensors: shared memory
    return out


def _models():
    common = dict(pipe_parallel_size=0, true_vocab_size=TOKENS, vocab_size=ROWS_TP1)
    return [neox_args(z_loss=1e-3, **common), llama_args(**common)]


def test_the_loss_is_the_same_at_tp1_and_tp2_whatever_the_padding():
    runs, references = [], []
    for index, args in enumerate(_models()):
        batches = _batches(seed=index)
        model = build_gpt(args)
        state, tables = _with_rows(args, full_state_dict(model), ROWS_TP1, seed=10 + index)
        load_full_state_dict(model, state)
        expected = _formula(model, batches, args.z_loss)
        loss, grads = _loss_and_grads(model, batches)
        assert abs(loss - expected) <= TOL * abs(expected), (args.norm, loss, expected)
        for name in tables:
            assert not grads[name][TOKENS:].any(), f"{name}: padding rows got a gradient"
        args2 = dataclasses.replace(args, vocab_size=ROWS_TP2)
        state2, _ = _with_rows(args2, state, ROWS_TP2, seed=20 + index)
        runs.append((args2, state2, batches))
        references.append((loss, grads, tables))
    results = run_distributed(_tp2, 2, runs)
    for index, (loss, grads, tables) in enumerate(references):
        for rank_results in results:
            loss2, grads2 = rank_results[index]
            assert abs(loss2 - loss) <= TOL * abs(loss), (index, loss2, loss)
            for name, grad in grads.items():
                grad2 = torch.from_numpy(grads2[name])
                if name in tables:
                    assert not grad2[TOKENS:].any(), f"{name}: padding rows got a gradient"
                    grad, grad2 = grad[:TOKENS], grad2[:TOKENS]
                torch.testing.assert_close(grad2, grad, rtol=1e-5, atol=1e-6, msg=name)
