"""`torch_compile`: what the config refuses, and what the training model build compiles.

The losses of compiled training against eager, on both engines, are compared in
`tests/parallel/test_train_compiled.py`; here, without running a step (no compilation):

- the combinations `megatron/config/checks/torch_compile.py` refuses (dropout, fused kernels in use)
  fail at resolution naming the keys, and the harmless neighbours (a fusion key whose kernel
  no layer uses, ZeRO 3) are accepted;
- `build_model_for_engine` compiles every transformer layer in place, and nothing else, only
  when the key is set, keeping every parameter name.
"""

from __future__ import annotations

import pytest
import torch

from megatron.config.schema import ConfigError
from megatron.model.specs import TRANSFORMER_LAYER_NAMES
from megatron.training.setup.model import build_model_for_engine
from tests.tiny import tiny_config

PLAIN = dict(pipe_parallel_size=0, hidden_dropout=0.0, attention_dropout=0.0)


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(hidden_dropout=0.1), ["hidden_dropout", "dropout"]),
        (dict(attention_dropout=0.1), ["attention_dropout", "RNG tracker"]),
        (
            dict(scaled_upper_triang_masked_softmax_fusion=True),
            ["scaled_upper_triang_masked_softmax_fusion", "fused CUDA kernels"],
        ),
        (dict(scaled_masked_softmax_fusion=True), ["scaled_masked_softmax_fusion"]),
        (dict(pos_emb="rotary", rope_fusion=True), ["rope_fusion", "fake-tensor"]),
    ],
)
def test_refused_combinations_name_the_keys(changes, named):
    tiny_config(**{**PLAIN, **changes})  # fine without torch_compile
    with pytest.raises(ConfigError) as error:
        tiny_config(**{**PLAIN, **changes}, torch_compile=True)
    message = str(error.value)
    assert "torch_compile" in message and "torch_compile: false" in message
    for word in named:
        assert word in message


@pytest.mark.parametrize(
    "changes",
    [
        # The fused softmax key has no effect when every layer is flash (the 160M config).
        dict(scaled_upper_triang_masked_softmax_fusion=True, attention_config=[[["flash"], 2]]),
        dict(rope_fusion=True, pos_emb="learned"),
        dict(zero_optimization={"stage": 3}),
    ],
)
def test_accepted_combinations(changes):
    assert tiny_config(**{**PLAIN, **changes}, torch_compile=True).training.torch_compile


def _layers(model):
    return [m for m in model.modules() if type(m).__name__ in TRANSFORMER_LAYER_NAMES]


def test_training_build_compiles_each_transformer_layer_in_place():
    eager = build_model_for_engine(tiny_config(**PLAIN), None, {})
    compiled = build_model_for_engine(tiny_config(**PLAIN, torch_compile=True), None, {})
    assert tiny_config(**PLAIN).training.torch_compile is False  # off by default
    assert len(_layers(compiled)) == 2
    assert all(layer._compiled_call_impl is not None for layer in _layers(compiled))
    assert all(layer._compiled_call_impl is None for layer in _layers(eager))
    others = [m for m in compiled.modules() if m not in _layers(compiled)]
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in others)
    assert list(compiled.state_dict()) == list(eager.state_dict())


def test_bf16_compile_refused_on_a_cpu_when_the_model_is_built():
    bf16 = tiny_config(**PLAIN, precision="bfloat16", torch_compile=True)  # resolves anywhere
    build_model_for_engine(tiny_config(**PLAIN, precision="bfloat16"), None, {})  # eager: fine
    if torch.cuda.is_available():
        pytest.skip("the refusal is for CPUs")
    with pytest.raises(ConfigError, match="torch_compile with bf16 precision cannot run on a CPU"):
        build_model_for_engine(bf16, None, {})
