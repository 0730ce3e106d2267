"""A mixture-of-experts train step reads what the dense one reads (the non-finite flag) plus,
dropless, one small transfer per MoE layer forward (its per-expert counts,
`megatron/model/moe_dispatch.py`); with token dropping nothing more. The router losses stay
on the device: `moe_loss_record` reduces them there and the log reads them with its losses in
one transfer. Counted with `tests/device_costs.py::HostReads` while the real trainer steps
(both engines, 2 MoE layers of 4 experts, top-2, 2 micro-batches), and checked against the
Switch and z-loss formulas written here."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.device_costs import HostReads
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

MOE = dict(
    moe_num_experts=4,
    moe_top_k=2,
    moe_expert_interval=1,  # both layers of the tiny model
    moe_aux_loss_coeff=0.01,
    moe_z_loss_coeff=0.001,
)
CASES = {
    "topk": dict(moe_router_type="topk"),
    "sinkhorn": dict(moe_router_type="sinkhorn"),
    "dropping": dict(moe_router_type="topk", moe_token_dropping=True),
    "topk-recompute": dict(moe_router_type="topk", checkpoint_activations=True),
}
MICRO_BATCHES = 2  # tiny_settings' gradient_accumulation_steps


def _engine_steps(cfg, topology):
    from megatron.data import build_tokenizer
    from megatron.training.loop.signals import StopRequest
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.nonfinite import NonFiniteSteps
    from megatron.training.step.steps import engine_steps

    parts = build_engine(cfg, topology, 5)
    steps = engine_steps(parts.engine, topology)
    NonFiniteSteps(
        parts.engine, parts.optimizer, topology, steps.local_loss, StopRequest()
    ).install()
    batch = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
    batches = BatchFactory(cfg, topology, batch, parts.engine.device)(build_datasets(cfg, 5)[0], 0)
    steps.train(batches)  # the first step builds what later steps reuse
    state = parts.optimizer.state.values()  # its step counters live on the host on every device
    counters = [s["step"] for s in state if torch.is_tensor(s.get("step"))]
    return parts.engine, steps, batches, counters


def _reads_per_step(rank, world_size, folder):
    from megatron.launcher.worker import initialize_distributed
    from megatron.model.moe import moe_layers
    from megatron.parallel.random import seed_everything
    from megatron.training.metrics.monitor import TrainMonitor

    out = {}
    for name, keys in CASES.items():
        for pp in (0, 1):
            settings = tiny_settings(f"{folder}/{name}{pp}", save=None, load=None, train_iters=5,
                                     pipe_parallel_size=pp, **MOE, **keys)  # fmt: skip
            cfg = resolve(settings, world_size)
            topology = initialize_distributed(cfg)
            seed_everything(cfg.training.seed)
            engine, steps, batches, counters = _engine_steps(cfg, topology)
            monitor = TrainMonitor(1, 1.0, world_size=1, peak_tflops=None, train_iters=5)
            with HostReads(exempt=counters) as reads:
                for _ in range(2):
                    monitor.step(steps.train(batches), True, steps.moe_losses)
            forwards = [layer.moe_loss_sums["n"] for layer in moe_layers(engine.module)]
            with HostReads() as logging:
                record = monitor.record(5, lr=0.0, grad_norm=None, loss_scale=None)
            out[(name, pp)] = (reads.count / 2, reads.report(), forwards, logging.count, record)
    return out


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """Two counted steps of each MoE case on each engine (one rank)."""
    return run_distributed(_reads_per_step, 1, str(tmp_path_factory.mktemp("moe")))[0]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("pp", [0, 1])
def test_a_moe_train_step_reads_the_flag_and_at_most_one_count_per_layer_forward(stepped, name, pp):
    reads, report, forwards, _, _ = stepped[(name, pp)]
    recompute = 2 if "recompute" in name else 1  # the recompute runs each layer again
    assert forwards == [MICRO_BATCHES * recompute] * 2
    counts = 0 if CASES[name].get("moe_token_dropping") else sum(forwards)
    assert reads == 1 + counts, f"{name}, pipe_parallel_size {pp}: {report}"


@pytest.mark.parametrize("pp", [0, 1])
def test_the_log_reads_the_router_losses_with_the_losses_once(stepped, pp):
    for name in CASES:
        _, _, _, logging, record = stepped[(name, pp)]
        assert logging == 1, name
        for key in ("moe_aux_loss", "moe_z_loss"):
            assert type(record[key]) is float and math.isfinite(record[key]), (name, key)
        assert record["moe_z_loss"] > 0
        assert (record["moe_aux_loss"] > 0) == (name != "sinkhorn")  # Sinkhorn: no aux loss


def _switch_and_z(inputs, weight, aux_coeff, z_coeff) -> float:
    """aux_coeff * E * sum_e f_e P_e + z_coeff * mean_t logsumexp_t^2 of one forward, looped."""
    logits = (inputs.double() @ weight.double().t()).tolist()
    tokens, experts = len(logits), len(logits[0])
    chosen, mean_p, z = [0] * experts, [0.0] * experts, 0.0
    for row in logits:
        total = sum(math.exp(v) for v in row)
        probs = [math.exp(v) / total for v in row]
        for e in sorted(range(experts), key=lambda e: -probs[e])[:2]:
            chosen[e] += 1
        for e in range(experts):
            mean_p[e] += probs[e] / tokens
        z += math.log(total) ** 2 / tokens
    share = [c / (2 * tokens) for c in chosen]
    return aux_coeff * experts * sum(f * p for f, p in zip(share, mean_p)) + z_coeff * z


def test_moe_loss_record_is_the_formulas_and_reads_nothing():
    """Two micro-batches through a model with two MoE layers: the record is the sum over layers
    of the mean over forwards of the router losses, as device tensors, read by no one."""
    from megatron.model import build_gpt
    from megatron.model.moe import moe_layers
    from megatron.training.step.moe_grads import moe_loss_record, prepare_moe_step
    from tests.unit.model.tiny import SEQ, neox_args

    torch.manual_seed(0)
    args = neox_args(**MOE, moe_router_type="topk", hidden_dropout=0.0, attention_dropout=0.0)
    model = build_gpt(args)
    seen = {layer: [] for layer in moe_layers(model)}
    for layer in seen:
        layer.router.register_forward_hook(lambda m, i, o, k=layer: seen[k].append(i[0].detach()))
    prepare_moe_step(model, MICRO_BATCHES)
    for _ in range(MICRO_BATCHES):
        tokens = torch.randint(0, args.vocab_size, (2, SEQ))
        loss = model.loss_fn(model(tokens, torch.arange(SEQ)[None]), (tokens, torch.ones(2, SEQ)))
        loss.backward()
    topology = SimpleNamespace(pp_group=None, dp_group=None, dp_size=1)
    with HostReads() as reads:
        record = moe_loss_record(model, topology)
    assert reads.count == 0, reads.report()
    expected = sum(
        sum(_switch_and_z(x, layer.router.weight, 0.01, 0.001) for x in inputs) / len(inputs)
        for layer, inputs in seen.items()
    )
    assert all(len(inputs) == MICRO_BATCHES for inputs in seen.values())
    got = record["moe_aux_loss"] + record["moe_z_loss"]
    assert torch.is_tensor(got) and float(got) == pytest.approx(expected, rel=1e-5)
