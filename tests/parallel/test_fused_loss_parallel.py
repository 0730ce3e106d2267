"""The fused head and loss (`loss_chunk_tokens` > 0) at tp 2 and pp 2: one spawn of 4 gloo ranks.

- `linear_cross_entropy` at tp 2 (each rank a vocabulary shard, the last one with padding
  columns), with a loss mask, label smoothing and z-loss: the loss, the hidden states' gradient
  (all-reduced by the copy into the tensor-parallel region, as the head does) and each rank's
  rows of the weight's gradient equal `torch.nn.functional.cross_entropy` on the full fp64
  logits plus PaLM's z-loss written here, within 1e-6 relative; and it runs exactly one max and
  one sum all-reduce per chunk. The same for `linear_log_probs` (DPO/KTO's log-probabilities)
  against `F.log_softmax` at the targets, with a random per-token upstream gradient.
- DeepSpeed's pipeline engine, Pythia-style toy (embedding tied across the first and the last
  stage) at tp 2, pp 2, and Llama-style toy (untied head) at tp 2, dp 2 with sequence
  parallelism; and DeepSpeed's plain engine (`pipe_parallel_size: 0`, ZeRO 0) at tp 2, dp 2
  with sequence parallelism: the train loss and the gradients the optimizer receives (gathered
  over tp) equal the single-process model's that writes full logits (`loss_chunk_tokens: 0`)
  within 1e-5 relative, as `test_pipeline_parity.py` holds the unfused engines to; the padded
  vocabulary and a z-loss are on.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from tests.distributed import run_distributed
from tests.parallel.test_model_plain_engine import engine_step
from tests.parallel.test_pipeline_parity import run_engine
from tests.unit.model.tiny import (
    assert_close,
    llama_args,
    micro_batches,
    neox_args,
    reference_loss_and_grads,
)

TOKENS, HIDDEN, PADDED, VOCAB, CHUNK = 23, 8, 20, 17, 6
EPS, Z = 0.1, 1e-2
FUSED = dict(loss_chunk_tokens=5, true_vocab_size=120, z_loss=1e-3)


def batches_of(args, count, seed):
    """`micro_batches` whose labels are tokens of the true vocabulary (below the padding)."""
    vocab = args.true_vocab_size
    return [
        (inputs, (labels % vocab, mask))
        for inputs, (labels, mask) in micro_batches(args, count, seed)
    ]


def check_function_at_tp2(topo):
    """Asserts on each rank (module docstring, first item)."""
    from megatron.parallel import chunked_cross_entropy as module
    from megatron.parallel import copy_to_tensor_parallel_region

    gen = torch.Generator().manual_seed(4)  # the same batch on every rank
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen)
    weight = torch.randn(PADDED, HIDDEN, generator=gen)
    target = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    mask = (torch.rand(TOKENS, generator=gen) > 0.3).float()

    full_h = hidden.double().requires_grad_()
    full_w = weight.double().requires_grad_()
    logits = (full_h @ full_w.t())[:, :VOCAB]
    ce = F.cross_entropy(logits, target, reduction="none", label_smoothing=EPS)
    ref = ((ce + Z * torch.logsumexp(logits, -1) ** 2) * mask).sum() / mask.sum()
    ref.backward()

    shard = PADDED // 2
    rows = slice(topo.tp_rank * shard, (topo.tp_rank + 1) * shard)
    h = hidden.clone().requires_grad_()
    w = weight[rows].clone().requires_grad_()
    calls = []
    reduce = module.all_reduce
    module.all_reduce = lambda x, group, op="sum": calls.append(op) or reduce(x, group, op)
    try:
        weights = mask / mask.sum()
        loss = module.linear_cross_entropy(
            copy_to_tensor_parallel_region(h, topo.tp_group),
            w,
            target,
            weights,
            z_weights=Z * weights,
            tp_group=topo.tp_group,
            label_smoothing=EPS,
            vocab_size=VOCAB,
            chunk_tokens=CHUNK,
        )
    finally:
        module.all_reduce = reduce
    loss.backward()
    chunks = -(-TOKENS // CHUNK)
    assert calls == ["max", "sum"] * chunks, calls
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    assert_close(h.grad.double(), full_h.grad, "hidden states' gradient", tol=1e-6)
    assert_close(w.grad.double(), full_w.grad[rows], "weight shard's gradient", tol=1e-6)

    # DPO/KTO's per-token log-probabilities at tp 2, for a per-token upstream gradient
    upstream = torch.randn(TOKENS, generator=gen, dtype=torch.float64)
    full_h.grad, full_w.grad = None, None
    ref_logps = F.log_softmax((full_h @ full_w.t())[:, :VOCAB], -1)
    ref_logps = ref_logps.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    (ref_logps * upstream).sum().backward()
    h.grad, w.grad = None, None
    logps = module.linear_log_probs(
        copy_to_tensor_parallel_region(h, topo.tp_group),
        w,
        target,
        tp_group=topo.tp_group,
        vocab_size=VOCAB,
        chunk_tokens=CHUNK,
    )
    (logps * upstream.float()).sum().backward()
    assert_close(logps.double(), ref_logps.detach(), "log-probabilities", tol=1e-6)
    assert_close(h.grad.double(), full_h.grad, "log-probs' hidden gradient", tol=1e-6)
    assert_close(w.grad.double(), full_w.grad[rows], "log-probs' weight gradient", tol=1e-6)


def _worker(rank, world_size, layouts, plain_runs):
    import deepspeed

    from megatron.parallel import ParallelTopology

    deepspeed.init_distributed(dist_backend="gloo")
    check_function_at_tp2(ParallelTopology(tp_size=2, pp_size=0))
    results = []
    for args, tp, pp, batches in layouts:
        topo = ParallelTopology(tp_size=tp, pp_size=pp)
        results.append(run_engine(args, topo, batches, 0))
    plain = [engine_step(args, batches, 0) for args, batches in plain_runs]
    return results, plain


def _check(loss, grads, args, batches):
    unfused = dataclasses.replace(
        args, loss_chunk_tokens=0, sequence_parallel=False, checkpoint_activations=False
    )
    ref_loss, ref_grads, _ = reference_loss_and_grads(unfused, batches)
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (loss, ref_loss)
    for name, grad in grads.items():
        assert_close(torch.from_numpy(grad), ref_grads[name], f"gradient of {name}")
    return set(grads), set(ref_grads)


def test_fused_loss_on_both_engines_matches_the_unfused_single_process_model():
    neox = neox_args(pipe_parallel_size=2, **FUSED)
    llama = llama_args(pipe_parallel_size=1, sequence_parallel=True, **FUSED)
    neox_sp = neox_args(pipe_parallel_size=0, sequence_parallel=True, **FUSED)
    neox_batches, llama_batches = batches_of(neox, 2, seed=1), batches_of(llama, 4, seed=2)
    layouts = [(neox, 2, 2, neox_batches), (llama, 2, 1, llama_batches)]
    plain_runs = [(neox_sp, batches_of(neox_sp, 2, seed=5))]
    per_rank = run_distributed(_worker, 4, layouts, plain_runs, timeout=600)
    for index, (args, _tp, _pp, batches) in enumerate(layouts):
        seen, every = set(), set()
        for results, _ in per_rank:
            result = results[index]
            assert abs(result["eval_loss"] - result["train_loss"]) <= 1e-6 * result["train_loss"]
            compared, every = _check(result["train_loss"], result["grads"], args, batches)
            seen |= compared
        assert seen == every, f"parameters never compared: {every - seen}"
    for index, (args, batches) in enumerate(plain_runs):
        for _, plain in per_rank:
            result = plain[index]
            compared, every = _check(result["loss"], result["grads"], args, batches)
            assert compared == every
