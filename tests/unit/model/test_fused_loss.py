"""The model with `loss_chunk_tokens` > 0 (the head fused with the loss) against the same model
writing full logits, one process, fp32:

- tied (Pythia-style), untied (Llama-style) and MoE models, padded vocabulary, z-loss, loss
  mask: the loss and the gradient of every parameter (the tied embedding's included) within
  1e-6 of the unfused model's (max-abs error over max-abs value);
- bf16: the same loss and every gradient within bf16 rounding of the unfused bf16 model's;
- the same FLOPs in a training step (torch's FLOP counter): no head matmul is recomputed;
- DPO and KTO from chunked log-probabilities: the same loss and every gradient within 1e-6, and
  exactly one head forward more of FLOPs (the backward's recomputation, which the step-time
  plan counts);
- evaluation (`torch.no_grad`): the same loss;
- generation/scoring (`inference_config`) and muP's coordinate check build the logits head;
- the heads return their inputs `(hidden (s, b, h), weight)` and the weight is the head's own
  parameter (tied: the embedding table), so DeepSpeed's tied-weight all-reduce sees its grad.

`tests/unit/training/test_loss_buffers.py` counts the tokens x vocabulary buffers of a fused
step at GPT-NeoX's vocabulary (none).
"""

from __future__ import annotations

import pytest
import torch

from megatron.model import build_gpt, full_state_dict
from tests.unit.model.tiny import assert_close, llama_args, neox_args

BATCH, SEQ = 4, 16
VOCAB, TRUE_VOCAB = 256, 250


MOE = dict(moe_num_experts=4, moe_top_k=2, moe_router_type="topk", moe_expert_interval=2)


def _args(kind: str, **changes):
    make = llama_args if kind == "untied" else neox_args
    if kind == "moe":  # experts on layers 0 and 2, dropout off (the routing is then fixed)
        changes = dict(MOE, hidden_dropout=0.0, attention_dropout=0.0, **changes)
    return make(**{"vocab_size": VOCAB, "true_vocab_size": TRUE_VOCAB, "z_loss": 1e-3, **changes})


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, TRUE_VOCAB, (BATCH, SEQ + 1), generator=gen)
    positions = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
    mask = (torch.rand(BATCH, SEQ, generator=gen) > 0.2).float()
    return (tokens[:, :-1], positions), (tokens[:, 1:].contiguous(), mask)


def _loss_and_grads(args, batch):
    model = build_gpt(args)
    inputs, labels = batch
    loss = model.loss_fn(model(*inputs), labels)
    loss.backward()
    return loss.detach(), full_state_dict(model, grads=True)


@pytest.mark.parametrize("kind", ["tied", "untied", "moe"])
@pytest.mark.parametrize("chunk", [5, 64, 1000])
def test_fused_loss_and_every_gradient_equal_the_unfused_model(kind, chunk):
    batch = _batch()
    ref_loss, ref_grads = _loss_and_grads(_args(kind), batch)
    loss, grads = _loss_and_grads(_args(kind, loss_chunk_tokens=chunk), batch)
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        assert_close(grad, ref_grads[name], f"gradient of {name}", tol=1e-6)


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_bf16_loss_and_gradients_equal_the_unfused_bf16_model_to_bf16_rounding(kind):
    """bf16 weights (as DeepSpeed's bf16 engines hold them): the same fp32 loss from the same
    bf16 logits, and every gradient within one bf16 rounding step (2^-8 of its norm): the
    weight's gradient is summed over chunks in fp32 where the unfused head's is one bf16
    matmul."""
    inputs, labels = _batch()
    runs = []
    for chunk in (0, 16):
        model = build_gpt(_args(kind, loss_chunk_tokens=chunk)).to(torch.bfloat16)
        loss = model.loss_fn(model(*inputs), labels)
        loss.backward()
        runs.append((loss.detach(), full_state_dict(model, grads=True)))
    (ref_loss, ref_grads), (loss, grads) = runs
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    for name, grad in grads.items():
        assert grad.dtype == torch.bfloat16, name
        ref = ref_grads[name].double()
        error = (grad.double() - ref).norm() / ref.norm().clamp_min(1e-30)
        assert error <= 2.0**-8, f"gradient of {name}: {error:.2e}"


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_heads_hand_their_own_weight_to_the_loss(kind):
    model = build_gpt(_args(kind, loss_chunk_tokens=8))
    inputs, _ = _batch()
    hidden, weight = model(*inputs)
    assert hidden.shape == (SEQ, BATCH, model.args.hidden_size)  # (s, b, h)
    name = "tied_modules.embed.word_embeddings.weight" if kind == "tied" else None
    params = dict(model.named_parameters())
    head = params[name] if name else next(p for n, p in params.items() if "final_linear" in n)
    assert weight() is head


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_a_fused_step_runs_the_unfused_steps_flops(kind):
    """The head's three matrix multiplies, no recomputation: torch's FLOP counter sees the
    same step FLOPs on both paths (so `training_flops_per_token` holds for both)."""
    from tests.flop_counter import flop_counter

    inputs, labels = _batch()
    flops = []
    for chunk in (0, 16):
        model = build_gpt(_args(kind, loss_chunk_tokens=chunk))
        with flop_counter() as counter:
            model.loss_fn(model(*inputs), labels).backward()
        flops.append(counter.get_total_flops())
    assert flops[0] == flops[1] > 0


def test_evaluation_loss_is_the_same():
    batch = _batch(seed=1)
    losses = []
    for chunk in (0, 7):
        model = build_gpt(_args("tied", loss_chunk_tokens=chunk)).eval()
        with torch.no_grad():
            losses.append(model.loss_fn(model(*batch[0]), batch[1]).item())
    assert abs(losses[0] - losses[1]) <= 1e-6 * abs(losses[0])


def test_tools_that_read_logits_build_the_unfused_head():
    from megatron.inference.model import inference_config
    from megatron.model.mup_coord import widen
    from tests.tiny import tiny_config

    assert widen(_args("tied", loss_chunk_tokens=8), 64, None).loss_chunk_tokens == 0
    cfg = tiny_config(loss_chunk_tokens=8)
    assert cfg.model.loss_chunk_tokens == 8
    assert inference_config(cfg).model.loss_chunk_tokens == 0


def _objective_loss_and_grads(train_impl: str, chunk: int, labels):
    from megatron.training.objectives import build_objective
    from tests.tiny import tiny_config

    model = build_gpt(_args("tied", z_loss=0.0, loss_chunk_tokens=chunk))
    cfg = tiny_config().replace(
        train_impl=train_impl, true_vocab_size=TRUE_VOCAB, loss_chunk_tokens=chunk
    )
    objective = build_objective(cfg)
    objective.install(model)
    inputs, _ = _batch()
    loss = model.loss_fn(model(*inputs), labels)
    loss.backward()
    return loss.detach(), full_state_dict(model, grads=True)


@pytest.mark.parametrize("train_impl", ["dpo", "kto"])
def test_dpo_and_kto_losses_and_gradients_equal_the_unfused_model(train_impl):
    """The preference losses from chunked log-probabilities (`linear_log_probs`): the same
    loss and every gradient within 1e-6, the reference log-probabilities given."""
    gen = torch.Generator().manual_seed(7)
    _, (labels, mask) = _batch()
    from megatron.training.objectives.logprobs import sequence_logps

    with torch.no_grad():  # near the policy's own, so no sigmoid saturates
        model = build_gpt(_args("tied", z_loss=0.0))
        policy = sequence_logps(model(*_batch()[0]), labels, mask, vocab_size=TRUE_VOCAB)
    ref = policy + torch.randn(BATCH, generator=gen)
    if train_impl == "dpo":
        loss_inputs = (labels, mask, ref)
    else:
        reward = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]]).expand(BATCH, SEQ)
        loss_inputs = (labels, mask, ref, reward)
    ref_loss, ref_grads = _objective_loss_and_grads(train_impl, 0, loss_inputs)
    loss, grads = _objective_loss_and_grads(train_impl, 6, loss_inputs)
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    for name, grad in grads.items():
        assert_close(grad, ref_grads[name], f"gradient of {name}", tol=1e-6)


def test_chunked_log_probs_recompute_the_head_forward_once():
    """DPO's fused step runs the head's forward twice (the backward recomputes each chunk's
    logits): torch's FLOP counter sees 2·tokens·h·V more than the unfused step, the term
    `planning/steptime.py::step_flops` adds for DPO/KTO with `loss_chunk_tokens`."""
    from megatron.training.objectives import build_objective
    from tests.flop_counter import flop_counter
    from tests.tiny import tiny_config

    inputs, (labels, mask) = _batch()
    flops = []
    for chunk in (0, 16):
        model = build_gpt(_args("tied", z_loss=0.0, loss_chunk_tokens=chunk))
        cfg = tiny_config().replace(
            train_impl="dpo", true_vocab_size=TRUE_VOCAB, loss_chunk_tokens=chunk
        )
        build_objective(cfg).install(model)
        with flop_counter() as counter:
            model.loss_fn(model(*inputs), (labels, mask, torch.zeros(BATCH))).backward()
        flops.append(counter.get_total_flops())
    assert flops[1] - flops[0] == 2 * BATCH * SEQ * model.args.hidden_size * VOCAB
