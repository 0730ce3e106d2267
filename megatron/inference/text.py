"""`generate.py`'s work: prompts from the chosen source, generation, a jsonl of samples.

    generate_from_config(cfg)      # on every rank; generate.py calls it

`text_gen_type` picks the prompt source (one class each):

- `unconditional`: `num_samples` samples from the end-of-document token alone;
- `input-file`: the prompts of `sample_input_file`, separated by `prompt_end` (a newline by
  default; blank prompts are skipped);
- `interactive`: prompts typed on rank 0's terminal until an empty line or end of input.

Prompts are shared out over data-parallel replicas; rank 0 collects the results in prompt
order and writes one JSON object per sample to `sample_output_file`: `context`, `text`,
`prompt_tokens`, `tokens`, `length`, `finished` (ended by the end-of-document token) and
`duration_seconds`. Sampling draws from a generator seeded with `seed` (+ the replica index).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from megatron.inference.generation import Generated, generate
from megatron.inference.model import InferenceModel
from megatron.inference.sampling import SamplingSettings
from megatron.preflight.samples import claim_sample_file

EXCERPT_CHARS = 300


class PromptSource:
    """Where prompts come from; `batches()` yields lists of prompt texts."""

    shard_over_replicas = True

    def batches(self, cfg):
        raise NotImplementedError


class Unconditional(PromptSource):
    def batches(self, cfg):
        yield [""] * cfg.generation.num_samples


class InputFile(PromptSource):
    def batches(self, cfg):
        g = cfg.generation
        if not g.sample_input_file:
            raise ValueError("text_gen_type 'input-file' needs sample_input_file (a text file)")
        path = Path(g.sample_input_file)
        if not path.is_file():
            raise FileNotFoundError(f"sample_input_file '{path}' does not exist")
        text = path.read_text(encoding="utf-8")
        yield [p.strip() for p in text.split(g.prompt_end or "\n") if p.strip()]


class Interactive(PromptSource):
    """Rank 0 reads a line; every rank receives it; an empty line or end of input stops."""

    shard_over_replicas = False

    def batches(self, cfg):
        while True:
            line = [None]
            if dist.get_rank() == 0:
                try:
                    line[0] = input("prompt (empty line ends)> ")
                except EOFError:
                    line[0] = ""
            dist.broadcast_object_list(line, src=0)
            if not line[0]:
                return
            yield [line[0]]


PROMPT_SOURCES: dict[str, type[PromptSource]] = {
    "unconditional": Unconditional,
    "input-file": InputFile,
    "interactive": Interactive,
}


def prompt_source(kind: str) -> PromptSource:
    if kind not in PROMPT_SOURCES:
        raise ValueError(
            f"text_gen_type '{kind}' is not supported by generate.py; valid: "
            f"{', '.join(PROMPT_SOURCES)}"
        )
    return PROMPT_SOURCES[kind]()


def record(text: str, result: Generated, tokenizer) -> dict:
    return {
        "context": text,
        "text": tokenizer.detokenize(result.tokens),
        "prompt_tokens": result.prompt,
        "tokens": result.tokens,
        "length": len(result.tokens),
        "finished": result.finished,
        "duration_seconds": result.seconds,
    }


def _gather(records: list[tuple[int, dict]], world: int) -> list[dict]:
    everyone: list = [None] * world
    dist.all_gather_object(everyone, records)
    merged = {}
    for part in everyone:
        merged.update(dict(part))
    return [merged[i] for i in sorted(merged)]


def run_prompts(model, tokenizer, texts, settings, source, generator) -> list[dict]:
    """Generate for `texts` (shared over replicas when the source allows); every rank gets
    the records of all prompts, in order."""
    topo = model.topology
    indices = list(range(len(texts)))
    if source.shard_over_replicas:
        indices = indices[topo.dp_rank :: topo.dp_size]
    prompts = [tokenizer.tokenize(texts[i]) or [tokenizer.eod] for i in indices]
    outputs = generate(model, prompts, settings, generator=generator)
    mine = [(i, record(texts[i], out, tokenizer)) for i, out in zip(indices, outputs)]
    if not source.shard_over_replicas:
        return [r for _, r in mine]
    return _gather(mine, dist.get_world_size())


def generate_from_config(cfg) -> list[dict]:
    """Set up, generate as `cfg.generation` says, write the jsonl on rank 0; return records."""
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    tokenizer = build_tokenizer(cfg)
    source = prompt_source(cfg.generation.text_gen_type)
    model = InferenceModel.from_config(cfg, topology, vocab_size=tokenizer.vocab_size)
    settings = SamplingSettings.from_config(cfg.generation, tokenizer.eod)
    generator = torch.Generator().manual_seed(cfg.training.seed + topology.dp_rank)
    out_path = claim_sample_file(cfg.generation.sample_output_file) if topology.rank == 0 else None
    everything = []
    for texts in source.batches(cfg):
        records = run_prompts(model, tokenizer, texts, settings, source, generator)
        everything += records
        if topology.rank == 0:
            with out_path.open("a", encoding="utf-8") as f:
                for rec in records:
                    f.write(json.dumps(rec) + "\n")
            if isinstance(source, Interactive):
                print(records[0]["text"], file=sys.stdout, flush=True)
    if topology.rank == 0:
        print(summary(everything, out_path, show_one=not isinstance(source, Interactive)))
    return everything


def _excerpt(text: str) -> str:
    text = json.dumps(text, ensure_ascii=False)
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 4] + '..."'


def summary(records: list[dict], path: Path, *, show_one: bool) -> str:
    """What rank 0 prints at the end: where the samples went, and the first of them."""
    lines = [f"wrote {len(records)} sample(s) to {path}"]
    if show_one and records:
        first = records[0]
        lines.append(f"  first prompt: {_excerpt(first['context'])}")
        lines.append(f"  its sample ({first['length']} tokens): {_excerpt(first['text'])}")
    return "\n".join(lines)
