"""Model states against the ZeRO paper's accounting (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", section 3 and figure 1).

Mixed-precision Adam keeps, per parameter, 2 bytes of fp16 weights, 2 of fp16 gradients and
K = 12 of optimizer states (fp32 weights, momentum, variance). Over N_d data-parallel ranks:

    baseline        (2 + 2 + K) Ψ
    P_os  (ZeRO 1)  2Ψ + 2Ψ + KΨ/N_d
    P_os+g (ZeRO 2) 2Ψ + (2 + K)Ψ/N_d
    P_os+g+p (3)    (2 + 2 + K)Ψ/N_d

Figure 1, Ψ = 7.5B and N_d = 64: 120, 31.4, 16.6 and 1.9 GB. DeepSpeed's wrappers keep these
terms (the optimizer's state traced on meta: Adam's two moments and a step counter per
tensor), plus what the paper leaves out, which the comparison leaves out by name: gradient
buckets and the step's temporaries, and at ZeRO 1 the reduced gradient partition DeepSpeed
fills beside the whole gradients at the accumulation boundary.
"""

from __future__ import annotations

import pytest

from megatron.planning.states import Group, Rank, model_states

PSI, ND, K = 7_500_000_000, 64, 12
PAPER_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
NOT_IN_THE_PAPER = ("bucket", "flattened", "copies", "new gradient", "previous", "gathered",
                    "before reduction", "persistent small", "of the step")  # fmt: skip


def paper(stage: int) -> float:
    """Bytes per rank of section 3's formulas."""
    return {
        0: (2 + 2 + K) * PSI,
        1: 2 * PSI + 2 * PSI + K * PSI / ND,
        2: 2 * PSI + (2 + K) * PSI / ND,
        3: (2 + 2 + K) * PSI / ND,
    }[stage]


def _rank(stage: int, dp: int) -> Rank:
    # one flat group of Ψ elements: the layers' matrices (1e8 each), as DeepSpeed flattens them
    numels = (100_000_000,) * (PSI // 100_000_000)
    group = Group(numels, dp, tuple((n,) for n in numels))
    return Rank([group], lp=2, dp=dp, zero={"stage": stage}, pipeline=False,
                optimizer_type="Adam", optimizer_params={})  # fmt: skip


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_keep_the_papers_bytes(stage):
    wrapper = "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer"
    states = model_states(_rank(stage, ND), wrapper)
    extra = NOT_IN_THE_PAPER + (("reduced gradient partition",) if stage == 1 else ())
    counted = [t for t in states.terms if not any(w in t.name for w in extra)]
    ours = sum(t.bytes for t in counted)
    assert ours == pytest.approx(paper(stage), rel=1e-6), [(t.name, t.bytes) for t in counted]
    assert ours / 1e9 == pytest.approx(PAPER_GB[stage], abs=0.05)


def test_the_baseline_is_mixed_precision_without_zero():
    states = model_states(_rank(0, ND), "FP16_UnfusedOptimizer")
    counted = [t for t in states.terms if not any(w in t.name for w in NOT_IN_THE_PAPER)]
    assert sum(t.bytes for t in counted) == pytest.approx(paper(0), rel=1e-6)
    assert paper(0) / 1e9 == PAPER_GB[0]
