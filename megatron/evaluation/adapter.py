"""Our model as an `lm-eval` language model: loglikelihood, rolling loglikelihood, generation.

`MegatronLM` subclasses lm-eval's `TemplateLM`, which owns the tokenisation conventions
(context/continuation split, the prefix token for empty contexts): the same code that scores
Hugging Face models in lm-eval, so the two give the same numbers for the same weights.
Scoring mirrors lm-eval's `HFLM`: the input is `(context + continuation)[-(max_length+1):-1]`,
the continuation's log-probabilities come from the last `len(continuation)` positions, and
`is_greedy` says whether argmax picks every continuation token; both the log-softmax and the
argmax run over the tokenizer's vocabulary only (`InferenceModel` cuts off the padding rows).
Rolling loglikelihood uses lm-eval's disjoint windows of `max_length` tokens; generation is
greedy (or sampled when the task asks) up to `max_gen_toks`, cut at the task's stop strings.

Distributed: every rank of every model replica runs the harness (lm-eval sees one process);
the forward passes are collective inside a replica, and requests are shared out over
data-parallel replicas and gathered back, so every rank returns the same results.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from megatron.inference import SamplingSettings, generate
from megatron.parallel import vocab_parallel_cross_entropy


def continuation_scores(logits, targets, counted) -> torch.Tensor:
    """`(b, 2)` per row: the sum of the log-probs of `targets` `(b, s)` over the `counted`
    `(b, s)` positions, and 1.0 where argmax picks every counted target (else 0.0). On the
    logits' device, so the host reads `(b, 2)` values instead of a copy of the `(b, s, V)`
    log-softmax; the log-probs come from the cross entropy's chunked logsumexp, which writes no
    buffer of the logits' size."""
    targets, counted = targets.to(logits.device), counted.to(logits.device)
    logprobs = -vocab_parallel_cross_entropy(logits, targets)  # (b, s): log p(target)
    total = torch.where(counted, logprobs, 0.0).sum(dim=-1)
    greedy = ((logits.argmax(dim=-1) == targets) | ~counted).all(dim=-1)
    return torch.stack([total, greedy.float()], dim=-1)


class MegatronLM(TemplateLM):
    """lm-eval's view of an `InferenceModel` and its tokenizer."""

    def __init__(self, model, tokenizer, *, batch_size: int = 8, max_gen_toks: int = 256):
        super().__init__()
        self.model = model
        self.text_tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_gen_toks = max_gen_toks
        self.max_length = model.args.max_positions

    # -- tokenisation ---------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.text_tokenizer.eod

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return list(self.text_tokenizer.tokenize(string))

    def tok_decode(self, tokens) -> str:
        return self.text_tokenizer.detokenize(tokens)

    def get_model_info(self) -> dict:
        topo = self.model.topology
        return {"model_parallel_size": topo.tp_size, "pipe_parallel_size": topo.pp_size}

    # -- data parallelism over replicas ---------------------------------------------------
    def _shared(self, items: list, work) -> list:
        """`work(my items)` on this replica's share; everyone gets all results in order."""
        topo = self.model.topology
        mine = list(range(topo.dp_rank, len(items), topo.dp_size))
        results = work([items[i] for i in mine])
        if topo.dp_size == 1:
            return results
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, list(zip(mine, results)))
        merged = {i: r for part in everyone for i, r in part}
        return [merged[i] for i in range(len(items))]

    # -- scoring --------------------------------------------------------------------------
    def _score_batch(self, batch: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """`(context, continuation)` token lists -> `(sum of log-probs, is greedy)` each."""
        inputs = [(ctx + cont)[-(self.max_length + 1) :][:-1] for ctx, cont in batch]
        width = max(len(x) for x in inputs)
        tokens = torch.full((len(batch), width), self.eot_token_id, dtype=torch.long)
        targets = torch.zeros((len(batch), width), dtype=torch.long)  # the next tokens
        counted = torch.zeros((len(batch), width), dtype=torch.bool)  # continuation positions
        for row, ((_, cont), x) in enumerate(zip(batch, inputs)):
            tokens[row, : len(x)] = torch.tensor(x)  # right padding: earlier logits unaffected
            targets[row, len(x) - len(cont) : len(x)] = torch.tensor(cont)
            counted[row, len(x) - len(cont) : len(x)] = True
        positions = torch.arange(width).expand(len(batch), width)
        logits = self.model.forward(tokens, positions)  # (b, s, V) on the last stage
        scores = None
        if logits is not None:
            scores = continuation_scores(logits, targets, counted)
        scores = self.model.broadcast_from_last_stage(scores, (len(batch), 2), torch.float32)
        return [(total, bool(greedy)) for total, greedy in scores.tolist()]  # the one read

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        def work(items):
            out = []
            for i in range(0, len(items), self.batch_size):
                out += self._score_batch(items[i : i + self.batch_size])
            return out

        return self._shared(pairs, work)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        return self._score([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, (string,) in enumerate(req.args for req in requests):
            for window in map(
                lm_utils.make_disjoint_window,
                lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(windows)):
            totals[owner] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # -- generation -----------------------------------------------------------------------
    def _generate_one(self, context: str, gen_kwargs: dict) -> str:
        kwargs = dict(gen_kwargs)
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        until.append(self.tok_decode([self.eot_token_id]))
        max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        sampled = kwargs.pop("do_sample", False)
        temperature = float(kwargs.pop("temperature", 0.0)) if sampled else 0.0
        tokens = self.tok_encode(context)[-max(1, self.max_length - max_new) :]
        settings = SamplingSettings(
            temperature=temperature,
            top_k=int(kwargs.pop("top_k", 0) or 0),
            top_p=float(kwargs.pop("top_p", 0.0) or 0.0),
            maximum_tokens=max_new,
            eod=self.eot_token_id,
        )
        (result,) = generate(self.model, [tokens or [self.eot_token_id]], settings)
        text = self.tok_decode(result.tokens)
        for stop in until:
            if stop:
                text = text.split(stop)[0]
        return text

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        def work(items):
            return [self._generate_one(context, kwargs) for context, kwargs in items]

        outputs = self._shared([req.args for req in requests], work)
        for request, text in zip(requests, outputs):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return outputs
