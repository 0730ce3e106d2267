"""Expert-parallel sizes in the checkpoint tools (issue 13), on a tiny random transformers Mixtral
(4 experts) imported at (tp=2, pp=2, ep=2):

- `tools/reshard.py --expert-parallel-size` moves it to ep 1 and ep 4 (other tp/pp too) with
  every full tensor equal, and to the source's ep by default;
- a file the writer gives expert-parallel rank 1 is read by the training loop's own loader
  (`moe_checkpoint.ExpertCheckpoint.load`): rank 1 gets experts 2-3 and their Adam moments;
- sizes the model cannot take, ZeRO targets at ep > 1, an ep for a model without experts
  (`convert_from_hf.py`) are refused by name;
- `tools/inspect_checkpoint.py` shows the saved ep and, asked about a resume at ep 1, names
  the reshard command.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from megatron.checkpoint.experts import is_expert_name  # noqa: E402
from megatron.checkpoint_tools import CheckpointReader, import_hf  # noqa: E402
from megatron.checkpoint_tools.optimizer_read import read_optimizer_state  # noqa: E402
from megatron.checkpoint_tools.optimizer_state import FullOptimizerState  # noqa: E402
from megatron.checkpoint_tools.reshard import target_config  # noqa: E402
from megatron.checkpoint_tools.schema import ModelSchema  # noqa: E402
from megatron.checkpoint_tools.writer import write_checkpoint  # noqa: E402
from megatron.model import ModelArgs, build_gpt  # noqa: E402
from megatron.training.checkpoint.experts import ExpertCheckpoint  # noqa: E402
from tests.unit.tools.test_hf_mixtral import random_mixtral  # noqa: E402
from tools import inspect_checkpoint, reshard  # noqa: E402


@pytest.fixture(scope="module")
def ep2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral_ep")
    random_mixtral().save_pretrained(folder / "hf")
    import_hf(folder / "hf", folder / "ep2", tp=2, pp=2, ep=2)
    return folder


def _reshard(src, out, *extra) -> CheckpointReader:
    argv = ["--checkpoint", str(src), "--output", str(out), *extra]
    assert reshard.main(argv) == 0
    return CheckpointReader(out)


@pytest.mark.parametrize(
    "tp, pp, ep, files",
    [
        (1, 1, 1, []),
        (1, 0, 4, ["pp0_ep1", "pp0_ep2", "pp0_ep3"]),
        (2, 2, None, ["pp0_ep1", "pp1_ep1"]),
    ],
)
def test_reshard_moves_experts_between_expert_parallel_sizes(ep2, tp, pp, ep, files, capsys):
    source = CheckpointReader(ep2 / "ep2")
    extra = ["--model-parallel-size", str(tp), "--pipe-parallel-size", str(pp)]
    extra += [] if ep is None else ["--expert-parallel-size", str(ep)]
    out = _reshard(ep2 / "ep2", ep2 / f"out_{tp}_{pp}_{ep}", *extra)
    want = 2 if ep is None else ep  # the default keeps the source's
    assert out.cfg.moe.moe_expert_parallel_size == want
    assert f"moe_expert_parallel_size {want}" in capsys.readouterr().out
    assert sorted(p.name for p in out.folder.glob("expert_states_*")) == [
        f"expert_states_{f}.pt" for f in files
    ]
    expected, actual = source.state_dict(), out.state_dict()
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def test_training_loader_restores_rank1_experts_and_moments_from_the_writer(ep2):
    """Plain engine (one expert file) with Adam state: rank 1's experts 2-3 and moments."""
    reader = CheckpointReader(ep2 / "ep2")
    state = reader.state_dict()
    gen = torch.Generator().manual_seed(5)
    moments = {
        name: {"step": torch.tensor(3.0), "exp_avg": torch.randn(t.shape, generator=gen)}
        for name, t in state.items()
    }
    groups = {g: {"lr": 1e-4, "weight_decay": 0.0, "name": g} for g in ("decay", "no_decay")}
    cfg = target_config(reader.cfg, 1, 0, 0, 2)  # plain engine, tp 1, ZeRO 0, ep 2
    args = ModelArgs.from_config(cfg)
    folder = write_checkpoint(
        ep2 / "plain",
        schema=ModelSchema(args),
        state=state,
        tp=1,
        pp=0,
        iteration=3,
        config_dict=cfg.to_dict(),
        optimizer=FullOptimizerState(moments, groups),
        ep=2,
    )
    model = build_gpt(args)
    experts = {n: p for n, p in model.named_parameters() if is_expert_name(n)}
    for name, p in experts.items():  # rank 1 holds experts 2-3 (E/ep of them)
        owner, _, leaf = name.rpartition(".")
        slot = torch.nn.Parameter(torch.zeros(2, *p.shape[1:]))
        slot.expert_parallel = True
        setattr(model.get_submodule(owner), leaf, slot)
    optimizer = SimpleNamespace(state={})
    topo = SimpleNamespace(ep_size=2, ep_rank=1, pp_rank=0, tp_rank=0, dp_rank=1)
    loader = ExpertCheckpoint(model, optimizer, topo)
    loader.load(folder, with_optimizer=True)
    for name in experts:
        p = model.get_parameter(name)
        assert torch.equal(p, state[name][2:]), name
        assert torch.equal(optimizer.state[p]["exp_avg"], moments[name]["exp_avg"][2:]), name
    # and the tools read the moments back whole
    back, why = read_optimizer_state(CheckpointReader(folder))
    assert why == ""
    for name in experts:
        assert torch.equal(back.per_param[name]["exp_avg"], moments[name]["exp_avg"]), name


def test_sizes_the_model_cannot_take_are_refused(ep2, capsys):
    base = ["--model-parallel-size", "1", "--pipe-parallel-size", "1"]
    assert_refused = [
        (["--expert-parallel-size", "3"], "must divide moe_num_experts 4"),
        (["--expert-parallel-size", "2", "--zero-stage", "1"], "--zero-stage 0"),
    ]
    for extra, message in assert_refused:
        with pytest.raises(ValueError, match=message):
            reshard.main(["--checkpoint", str(ep2 / "ep2"), "--output", str(ep2 / "x"),
                          *base, *extra])  # fmt: skip


def test_inspect_shows_the_expert_parallel_size_and_the_reshard_to_another(ep2, capsys):
    argv = ["--checkpoint", str(ep2 / "ep2"), "--no-norms"]
    assert inspect_checkpoint.main([*argv, "--resume-at", "tp=2,pp=2,dp=2,zero=0,ep=1"]) == 0
    out = capsys.readouterr().out
    assert "layout      tp=2 pp=2 zero=0 dp=2 ep=2" in out
    assert "resume      reshard:" in out and "--expert-parallel-size 1 --zero-stage 0" in out
    assert inspect_checkpoint.main([*argv, "--resume-at", "tp=2,pp=2,dp=2,zero=0"]) == 0
    assert "resume      direct" in capsys.readouterr().out  # ep: the saved one


def test_expert_parallel_import_of_a_model_without_experts_is_refused(tmp_path):
    import transformers

    from tools import convert_from_hf

    sizes = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                 intermediate_size=48, max_position_embeddings=16)  # fmt: skip
    config = transformers.MistralConfig(**sizes)
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path / "hf")
    argv = ["--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "ours")]
    with pytest.raises(ValueError, match="--expert-parallel-size 2: mistral has no experts"):
        convert_from_hf.main([*argv, "--expert-parallel-size", "2"])


def test_writer_refuses_files_of_another_ep_than_the_recorded_config(ep2, tmp_path):
    reader = CheckpointReader(ep2 / "ep2")
    with pytest.raises(ValueError, match="moe_expert_parallel_size 2, the files are written for 1"):
        write_checkpoint(tmp_path, schema=reader.schema, state=reader.state_dict(), tp=1, pp=1,
                         iteration=0, config_dict=reader.cfg.to_dict())  # fmt: skip
