"""Shared pieces of the tests of Hugging Face families against `transformers` (fp32, CPU).

`randomise` gives every weight visible noise (norm weights around 1, so none hides behind an
identity); `import_and_read` imports a saved model at (tp=2, pp=2) and rebuilds it whole from
that checkpoint; `assert_logits_equal` and `greedy_with_cache` compare the forward pass and
cached greedy decoding (the generation path of `generate.py`) with transformers'.
"""

from __future__ import annotations

import dataclasses

import torch

from megatron.checkpoint_tools import CheckpointReader, import_hf
from megatron.inference.kv_cache import kv_cache
from megatron.model import build_gpt, load_full_state_dict

SEQ = 12


def randomise(model):
    """`model` with seeded noise on every parameter, in eval mode."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)
    return model.eval()


def import_and_read(hf, folder, ep: int = 1):
    """Save `hf`, import it at (tp=2, pp=2) and expert-parallel size `ep`, and read it back:
    `(our model, reader)`."""
    hf.save_pretrained(folder / "hf")
    import_hf(folder / "hf", folder / "ours", tp=2, pp=2, ep=ep)
    reader = CheckpointReader(folder / "ours")
    assert (reader.layout.tp, reader.layout.pp) == (2, 2)
    # the logits, compared with transformers'
    ours = build_gpt(dataclasses.replace(reader.args, pipe_parallel_size=0, loss_chunk_tokens=0))
    ours = ours.eval()
    load_full_state_dict(ours, reader.state_dict())
    return ours, reader


def assert_logits_equal(hf, ours, vocab: int) -> None:
    """Our logits (the real vocabulary) equal transformers' within 1e-5."""
    tokens = torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(2, SEQ)
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        actual = ours(tokens, positions)[..., :vocab]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def greedy_with_cache(model, prompt: torch.Tensor, steps: int, vocab: int) -> list[list[int]]:
    """Greedy decoding as `generate_batch` does it: prefill, then one token at a time."""
    batch, length = prompt.shape
    out = []
    with torch.no_grad(), kv_cache(model):
        logits = model(prompt, torch.arange(length).expand(batch, length))
        for step in range(steps):
            token = logits[:, -1, :vocab].argmax(-1)
            out.append(token)
            position = torch.full((batch, 1), length + step)
            logits = model(token[:, None], position)
    return torch.stack(out, 1).tolist()


def transformers_greedy(hf, prompt: torch.Tensor, steps: int) -> list[list[int]]:
    """transformers' greedy `generate`, the new tokens only."""
    with torch.no_grad():
        out = hf.generate(prompt, max_new_tokens=steps, do_sample=False, eos_token_id=None,
                          pad_token_id=0)  # fmt: skip
    return out[:, prompt.shape[1] :].tolist()
