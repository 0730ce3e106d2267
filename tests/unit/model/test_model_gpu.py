"""The model on a CUDA GPU: fused kernels and flash attention against the PyTorch paths.

- fp32 on the GPU: the fused softmax and rotary kernels (when built) and SDPA give the
  reference model's logits and gradients (1e-5 relative);
- bf16 on the GPU (what training runs): the fused/flash model stays within bf16 rounding of the
  fp32 model, for the Pythia-style and the Llama-style (GQA) toys;
- the kernel paths are really taken when their extensions are built (else those checks say so
  and the fallback is what is compared).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.kernels import kernel_available
from megatron.model import build_gpt, full_state_dict, load_full_state_dict
from megatron.model.attention_backends import FusedSoftmaxAttention
from tests.unit.model.tiny import assert_close, llama_args, micro_batches, neox_args

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def fused(args):
    """All GPU paths on: fused softmax + rotary for `global` layers, flash for the others."""
    return dataclasses.replace(
        args,
        softmax_fusion=True,
        rope_fusion=True,
        layer_attention_types=("global", "flash") * (args.num_layers // 2),
    )


def run(args, weights, batch, dtype):
    model = build_gpt(args)
    load_full_state_dict(model, weights)
    model = model.to("cuda", dtype)
    (tokens, positions), (labels, mask) = batch
    cuda = [t.cuda() for t in (tokens, positions, labels, mask)]
    logits = model(cuda[0], cuda[1])
    loss = model.loss_fn(logits, (cuda[2], cuda[3]))
    loss.backward()
    grads = {k: v.float().cpu() for k, v in full_state_dict(model, grads=True).items()}
    return logits.detach().float().cpu(), loss.item(), grads, model


@pytest.mark.parametrize("make_args", [neox_args, llama_args])
def test_fused_gpu_paths_match_reference_in_fp32(make_args):
    args = make_args(num_layers=2)
    weights = full_state_dict(build_gpt(args))
    (batch,) = micro_batches(args, 1)
    ref_logits, ref_loss, ref_grads, _ = run(args, weights, batch, torch.float32)
    logits, loss, grads, model = run(fused(args), weights, batch, torch.float32)
    assert_close(logits, ref_logits, "fp32 logits")
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    for name, grad in ref_grads.items():
        assert_close(grads[name], grad, f"fp32 gradient of {name}")
    core = model.get_submodule("2.attention.core")
    assert isinstance(core, FusedSoftmaxAttention)
    scores = torch.zeros(2, 2, 16, 16, device="cuda")
    chosen = core.fused_softmax.select(scores).name
    assert chosen == ("cuda" if kernel_available("softmax") else "torch")


@pytest.mark.parametrize("make_args", [neox_args, llama_args])
def test_bf16_model_tracks_fp32(make_args):
    args = make_args(num_layers=2)
    weights = full_state_dict(build_gpt(args))
    (batch,) = micro_batches(args, 1)
    ref_logits, ref_loss, _, _ = run(args, weights, batch, torch.float32)
    logits, loss, _, _ = run(fused(args), weights, batch, torch.bfloat16)
    assert_close(logits, ref_logits, "bf16 logits", tol=3e-2)
    assert abs(loss - ref_loss) <= 1e-2 * abs(ref_loss)


def test_kernels_are_built_on_this_gpu():
    # Informative: the fused paths above fall back to PyTorch without the extensions.
    missing = [k for k in ("softmax", "rotary") if not kernel_available(k)]
    if missing:
        pytest.skip(f"fused kernels not built here: {missing} (python -m megatron.kernels.build)")
