"""Poems from a trained model: prompt normalisation, poetry controls, seeded batched sampling.

The one sampling path: `sample.py` (conf/sample.yaml's options), the `samples` table of
`model.training.callbacks.SampleLogger`, `benchmarks/sampling.py` and evaluation all go
through `stream_poems` / `sample_poems`, so every poem keeps the same rules
(`PoemBoundaries`, and the constraints asked for).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator

import torch

from data.poetry import LINE_END, is_hanzi
from data.tokenizer import Tokenizer
from model.sampling.constraints import PoemConstraint
from model.training.lit import LitGPT
from model.sampling.decoding import PoemBoundaries, RepetitionPenalty, check_sampling_args


@dataclass
class SamplingOptions:
    """What to sample. Units: tokens (= characters for the character model).

    prompt / acrostic: in either script (converted with OpenCC); form: wujue | qijue | wulv |
    qilv | None; rhyme: rhyme the even lines (needs form or acrostic); meter: 格律, every
    character's 平/仄 follows one of the form's standard patterns (needs form, implies rhyme);
    repetition_penalty: CTRL penalty on characters already in the poem (1.0 = off);
    temperature 0 = greedy.
    """
    prompt: str = ""
    num_samples: int = 1
    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = 200
    top_p: float | None = None
    seed: int = 1337
    form: str | None = None
    acrostic: str = ""
    rhyme: bool = False
    meter: bool = False
    repetition_penalty: float = 1.0
    use_cache: bool = True


@lru_cache(maxsize=8)
def poem_boundaries(tok: Tokenizer) -> PoemBoundaries:
    """The `PoemBoundaries` of a tokenizer's vocabulary (built once per tokenizer; stateless)."""
    texts = [tok.decode([i]) for i in range(tok.vocab_size)]
    closers = torch.tensor([t.endswith(tuple(LINE_END[1:])) for t in texts])  # (V,) bool
    marks = torch.tensor([t.startswith(tuple(LINE_END)) for t in texts])  # (V,) bool
    after_mark = torch.tensor([t.endswith(tuple(LINE_END)) for t in texts])  # (V,) bool
    return PoemBoundaries(closers, marks, after_mark, tok.bos_id, tok.eos_id)


def stream_poems(lit: LitGPT, opts: SamplingOptions) -> tuple[torch.Tensor, Iterator[torch.Tensor]]:
    """Check everything, then start sampling: returns (start (B, T0) int64, iterator of (B, 1)).

    `PoemBoundaries`: a poem ends only right after a sentence-final mark (。？！；), and a line
    mark never follows `<bos>` or another mark; `form` fixes where lines end. The model must be
    in eval mode for dropout-free sampling (`load_for_inference` gives one).
    Every check runs before the first token: raises ValueError for bad sampling arguments,
    a prompt or acrostic with invalid code points, outside the vocabulary, or breaking the
    form; max_new_tokens too small for the form.
    """
    check_sampling_args(opts.temperature, opts.top_k, opts.top_p)
    if opts.num_samples < 1:
        raise ValueError(f"num_samples must be ≥ 1, got {opts.num_samples}")
    tok, device = lit.tokenizer, lit.device
    prompt = lit.to_model_text(opts.prompt, "prompt")
    acrostic = lit.to_model_text(opts.acrostic, "acrostic")
    processors: list[Callable] = [poem_boundaries(tok)]
    if opts.form or acrostic or opts.rhyme or opts.meter:
        constraint = PoemConstraint(tok, opts.form, acrostic, opts.rhyme, lit.hparams.script, opts.meter)
        constraint.check_text(prompt)
        needed = constraint.max_tokens() - len(prompt)
        if opts.max_new_tokens < needed:
            raise ValueError(f"max_new_tokens={opts.max_new_tokens} is too few for this poem; it needs up to {needed}")
        processors.append(constraint)
    if opts.repetition_penalty != 1.0:
        penalised = torch.tensor([any(map(is_hanzi, tok.decode([i]))) for i in range(tok.vocab_size)])
        processors.append(RepetitionPenalty(opts.repetition_penalty, penalised))
    gen = torch.Generator(device=device).manual_seed(opts.seed)
    start = torch.tensor([tok.encode(prompt, bos=True)] * opts.num_samples, device=device)  # (B, T0)
    steps = lit.gpt.generate_stream(start, opts.max_new_tokens, opts.temperature, opts.top_k, opts.top_p,
                                    tok.eos_id, gen, opts.use_cache, processors)
    return start, steps


def sample_poems(lit: LitGPT, opts: SamplingOptions) -> list[str]:
    """`opts.num_samples` poems sampled in one batch, as text (prompt included, no line breaks).

    The same options and seed give the same poems. raises as `stream_poems`.
    """
    start, steps = stream_poems(lit, opts)
    out = torch.cat([start, *steps], dim=1)  # (B, T0 + n)
    return [lit.tokenizer.decode(row.tolist()) for row in out]
