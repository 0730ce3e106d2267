"""Files of GPT-NeoX's current trainer load: its tensor names and Llama-style layouts (issue 27).

A tiny `transformers` Llama (grouped-query attention, SwiGLU, RMSNorm, untied) is written here
as GPT-NeoX's current trainer holds such a model, per tensor-parallel rank, from GPT-NeoX's
definitions (its `ParallelSelfAttention.gqa_project`, `ParallelMLP` with `Gated_Activation`,
`RMSNorm`), not from our code:

- `attention.query_key_value.weight`: the rank's query heads, then its key heads, then its
  value heads (`gqa_project` splits the rank's output in that order);
- `mlp.linear1.weight`: the rank's up-projection rows, then its gate rows (`Gated_Activation`
  chunks the output in two, `x, gate`, and computes `act(gate) * x`); `mlp.linear2.weight`
  the down projection, split over its input columns;
- the norms' weight is `scale`; the head is `final_linear.weight`.

Our checkpoint tools read such a folder to the same tensors as our own import of the model,
and our layers, given those files as DeepSpeed gives them, compute transformers' logits.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.checkpoint_tools import CheckpointReader, import_hf
from megatron.model import build_gpt
from tests.unit.tools.hf_tiny import randomise

transformers = pytest.importorskip("transformers")

LAYERS, HEADS, KV_HEADS, HIDDEN, VOCAB = 2, 4, 2, 32, 128
FILE = "layer_{:02d}-model_{:02d}-model_states.pt"


def _rows(w: torch.Tensor, tp: int, t: int) -> torch.Tensor:
    return w.chunk(tp, dim=0)[t]


def _padded(table: torch.Tensor, rows: int) -> torch.Tensor:
    """GPT-NeoX's vocabulary table padded to its padded vocabulary (zero rows here)."""
    return torch.cat([table, table.new_zeros(rows - table.shape[0], table.shape[1])])


def neox_files(hf, tp: int, t: int, padded: int) -> dict[int, dict]:
    """GPT-NeoX's current layer files of tensor-parallel rank `t` (module docstring), with a
    vocabulary padded to `padded` rows."""
    sd = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    head = _padded(hf.state_dict()["lm_head.weight"], padded)
    files = {
        0: {"word_embeddings.weight": _rows(_padded(sd["embed_tokens.weight"], padded), tp, t)}
    }
    for i in range(LAYERS):
        p = f"layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        qkv = [_rows(sd[attn + f"{x}_proj.weight"], tp, t) for x in "qkv"]
        linear1 = [_rows(sd[mlp + f"{x}_proj.weight"], tp, t) for x in ("up", "gate")]
        files[i + 2] = {
            "input_layernorm.scale": sd[p + "input_layernorm.weight"],
            "attention.query_key_value.weight": torch.cat(qkv),
            "attention.dense.weight": sd[attn + "o_proj.weight"].chunk(tp, dim=1)[t],
            "post_attention_layernorm.scale": sd[p + "post_attention_layernorm.weight"],
            "mlp.linear1.weight": torch.cat(linear1),
            "mlp.linear2.weight": sd[mlp + "down_proj.weight"].chunk(tp, dim=1)[t],
        }
    files[LAYERS + 3] = {"norm.scale": sd["norm.weight"]}
    files[LAYERS + 4] = {"final_linear.weight": _rows(head, tp, t)}
    return files


def _llama(tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=16, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = randomise(transformers.LlamaForCausalLM(config))
    hf.save_pretrained(tmp_path / "hf")
    return hf


def test_checkpoint_tools_read_neox_current_names(tmp_path):
    hf = _llama(tmp_path)
    import_hf(tmp_path / "hf", tmp_path / "ours", tp=2, pp=1)
    ours = CheckpointReader(tmp_path / "ours")
    for t in range(2):
        for index, state in neox_files(hf, 2, t, ours.args.vocab_size).items():
            torch.save(state, ours.folder / FILE.format(index, t))
    expected = CheckpointReader(tmp_path / "ours")  # the same folder, now GPT-NeoX's files
    theirs = expected.state_dict()
    imported = import_hf(tmp_path / "hf", tmp_path / "again", tp=2, pp=1)
    again = CheckpointReader(imported.folder).state_dict()
    assert theirs.keys() == again.keys()
    for name, tensor in again.items():
        assert torch.equal(theirs[name], tensor), name


def test_our_layers_load_neox_current_files_and_match_transformers(tmp_path):
    hf = _llama(tmp_path)
    import_hf(tmp_path / "hf", tmp_path / "ours", tp=1, pp=1)
    args = CheckpointReader(tmp_path / "ours").args
    model = build_gpt(dataclasses.replace(args, pipe_parallel_size=0, loss_chunk_tokens=0))
    model.eval()
    for index, state in neox_files(
        hf, 1, 0, args.vocab_size
    ).items():  # as DeepSpeed loads each layer's file
        model.get_submodule(str(index)).load_state_dict(state, strict=True)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        actual = model(tokens, torch.arange(12).expand(2, 12))[..., :VOCAB]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
