"""The inference engine: a trained GPT with its tokenizer and script, as nanochat's `Engine`.

Text in either script becomes the model's (`to_model_text`, `poem_ids`, `encode_line`), ids come out one
step at a time (`steps`, `stream`, `generate`), with a KV cache. What is drawn at each step is
the caller's choice (`draw`: `model.decoding.next_token` with its temperature, top_k and
top_p, or `greedy`), and so are the logits processors (constraints, penalties): the engine knows
nothing of sampling. `steps` also returns, with each drawn token, what a viewer shows beside
it: the model's probability of it, the tokens the processors allowed, and the attention row of
every layer and head that predicted it. A checkpoint's engine comes from `model.loading.load_engine`,
without Lightning.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from data.tokenizer import Tokenizer, UnknownCharactersError, check_code_points
from data.verse.ci import CI
from data.verse.plan import plan_ids, poem_ids, tune_variant
from data.verse.script import prompt_to_script, variants
from data.verse.tunes import find_tune
from model.checkpoint_meta import CheckpointMeta
from model.gpt import GPT
from model.kv_cache import Cache

LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(idx (B, T) int64 the whole sequence so far, logits (B, vocab_size) float) → logits (B, vocab_size)."""
Draw = Callable[[torch.Tensor], torch.Tensor]
"""logits (B, vocab_size) float, after the processors → the next token of every row, (B, 1) int64."""


def pad(seqs: Sequence[Sequence[int]], device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences of different lengths as one batch, padded with 0 at the end (by causality
    no real position reads the padding) → (ids (B, T) int64, lengths (B,) int64), on device."""
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long, device=device)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.as_tensor(s, device=device)
    return ids, lengths


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The likeliest token of every row: logits (B, V) → (B, 1) int64."""
    return logits.argmax(dim=-1, keepdim=True)


@dataclass
class Step:
    """One drawn token of every row, and what produced it.

    ids: (B, 1) int64; tokens: each row's token as text (`Tokenizer.label`); prob: (B,) float,
    the model's probability of it (softmax of its logits, before processors and temperature);
    allowed: (B, V) bool, the tokens the processors left possible (logit not -inf), None without
    processors; attention_rows: n_layer tensors (B, n_head, L) float, the attention weights of the
    position whose output predicted the token (the last one fed) over the L positions in context,
    each row summing to 1 (None unless asked for).
    """
    ids: torch.Tensor
    tokens: list[str]
    prob: torch.Tensor
    allowed: torch.Tensor | None = None
    attention_rows: list[torch.Tensor] | None = None


class Engine:
    """model: a GPT in eval mode; tokenizer: its vocabulary; script: the corpus script it was
    trained on ('simplified' | 'traditional'); path: the checkpoint it was loaded from, if any;
    meta: what its checkpoint records beside the weights (`model.checkpoint_meta.CheckpointMeta`:
    condition shares, poets, corpora, fine-tuning, the weights' digest), empty if not given.
    The engine holds no weights of its own: the LightningModule holds one around the model it trains."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, script: str = "simplified", path: Path | None = None,
                 meta: CheckpointMeta | None = None):
        if model.cfg.vocab_size != tokenizer.vocab_size:
            raise ValueError(f"the model has {model.cfg.vocab_size} ids, the tokenizer {tokenizer.vocab_size}")
        self.model, self.tokenizer, self.script, self.path = model, tokenizer, script, path
        self.meta = CheckpointMeta() if meta is None else meta
        self.ablated: list[str] = []  # heads switched off, `L<layer>H<head>` (`model.ablation.ablate`)
        self.ablation_hooks: list = []  # the hooks that switch them off, removed when they are on again

    @property
    def device(self) -> torch.device:
        return self.model.wte.weight.device

    def to_model_text(self, text: str, option: str = "text") -> str:
        """A user's text (either script) → the model's script; every text entering the product
        passes here. Checks the code points (`data.tokenizer.check_code_points`), converts only
        what is not already in the model's script (`data.verse.script.prompt_to_script`, with the
        characters the model was trained on), and checks the vocabulary.

        option: the text's name in messages (`prompt`, `acrostic`, ...). raises
        InvalidCodePointsError, UnknownCharactersError naming the option and the characters
        still outside the vocabulary, with the in-vocabulary variants OpenCC knows for them.
        """
        script, tok = self.script, self.tokenizer
        text = prompt_to_script(check_code_points(text, option), script, tok.known_characters)
        if unknown := tok.unknown(text):
            hints = {c: sorted({v for v in (prompt_to_script(v, script, tok.known_characters) for v in variants(c))
                                if not tok.unknown(v)}) for c in unknown}
            said = ", ".join(f"{c} → {'/'.join(v)}" for c, v in hints.items() if v)
            raise UnknownCharactersError(unknown, f"Variants in the vocabulary: {said}." if said else "", option)
        return text

    def poem_ids(self, text: str, option: str = "text", eos: bool = True, tune: str = "") -> list[int]:
        """A text (either script, converted to the model's) framed as the model was trained on a
        poem (`data.verse.plan.poem_ids`): `<bos>`, for a model with plan tokens the text's plan as
        a poem (its form, `form_of`, and rhyme group: a couplet is `<其他>` `<无韵>`; with `tune`,
        either script, a 词: the token of the tune's template it is, or begins, on a model with tune
        tokens, else `<其他>`), its ids, and `<eos>` if eos; any length. raises as `to_model_text`;
        ValueError for an unknown tune, or, on a model with tune tokens, a text that is (begins) none
        of the tune's templates with a token."""
        tune = find_tune(tune) if tune else ""
        text = self.to_model_text(text, option)
        ids = plan_ids(self.tokenizer)
        if tune and ids is not None and ids.tunes and tune_variant(text, tune, complete=eos) is None:
            raise ValueError(f"{option} {text!r} is not {'' if eos else 'the start of '}a 词 to {tune}: its lines fit "
                             f"none of {tune}'s templates with a token (docs/tunes.md)")
        return poem_ids(self.tokenizer, text, self.script, CI if tune else None, eos=eos, tune=tune)

    def encode_line(self, text: str, option: str = "text", tune: str = "") -> tuple[torch.Tensor, list[str]]:
        """A line or poem as the model reads the start of a poem (`poem_ids` without `<eos>`; `tune`:
        read as a 词 to it) → ((1, T) int64 ids on the model's device, the T tokens as text:
        `<bos>`, plan tokens, then the characters, or BPE pieces).

        option: the text's name in messages. raises as `poem_ids`; ValueError if the text is empty
        or T exceeds the model's block_size.
        """
        if not text:
            raise ValueError(f"{option} is empty; give a line of poetry, e.g. 床前明月光，疑是地上霜。")
        ids = self.poem_ids(text, option, eos=False, tune=tune)
        if len(ids) > self.model.cfg.block_size:
            raise ValueError(f"{option} has {len(text)} characters; with <bos>{' and its plan' * bool(self.tokenizer.plan)} "
                             f"that is {len(ids)} positions, more "
                             f"than the model's block_size {self.model.cfg.block_size}. Use a shorter text.")
        return torch.tensor([ids], device=self.device), [self.tokenizer.label(i) for i in ids]

    @torch.no_grad()
    def steps(self, idx: torch.Tensor, max_new_tokens: int, draw: Draw = greedy, eos_id: int | None = None,
              use_cache: bool = True, processors: Sequence[LogitsProcessor] = (),
              attention_rows: bool = False) -> Iterator[Step]:
        """Yield a `Step` for the next token of every row, up to max_new_tokens times.

        idx: (B, T0) int64, any length: the model sees the last block_size tokens. With
        use_cache (default) each step feeds only the new token to the model's KV cache (`model.kv_cache.Cache`),
        which reuses the keys and values of the earlier ones and refills itself when full.
        Without it every step runs the whole text again in a fresh cache.
        Each step: processors (each `(idx so far, logits) → logits`, e.g. constraints; the (B, V)
        logits a processor gets are that step's alone, so it may write into them) → draw.
        Stops once every row has produced eos_id; a row that ended gets eos_id.
        attention_rows: fill `Step.attention_rows` (computed explicitly, whatever the backend).
        raises ValueError for non-finite logits from the model; `draw` raises for what it refuses.
        """
        done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
        cache = Cache(self.model.cfg.n_layer, self.model.cfg.block_size, attention_rows)
        logits = self.model(idx, cache=cache)  # (B, ≤ block_size, vocab_size): the prompt at once
        for step in range(max_new_tokens):
            logits = logits[:, -1, :].float()  # (B, vocab_size)
            if not torch.isfinite(logits).all():
                raise ValueError("the model produced non-finite logits (NaN or inf); the checkpoint is damaged "
                                 "or the precision too low")
            probs = F.softmax(logits, dim=-1)  # (B, vocab_size): the model's own distribution
            for process in processors:
                logits = process(idx, logits)
            nxt = draw(logits)  # (B, 1)
            if eos_id is not None:
                nxt = nxt.masked_fill(done[:, None], eos_id)
                done |= nxt[:, 0] == eos_id
            idx = torch.cat([idx, nxt], dim=1)
            yield Step(nxt, [self.tokenizer.label(i) for i in nxt[:, 0].tolist()], probs.gather(1, nxt)[:, 0],
                       ~torch.isneginf(logits) if processors else None,
                       [layer.weights.float() for layer in cache.layers] if attention_rows else None)
            if (eos_id is not None and done.all()) or step == max_new_tokens - 1:
                return
            if use_cache:
                logits = self.model(nxt, cache=cache)  # (B, 1, vocab_size), or the refilled window's
            else:
                cache = Cache(self.model.cfg.n_layer, self.model.cfg.block_size, attention_rows)
                logits = self.model(idx, cache=cache)

    def stream(self, idx: torch.Tensor, max_new_tokens: int, draw: Draw = greedy, eos_id: int | None = None,
               use_cache: bool = True, processors: Sequence[LogitsProcessor] = ()) -> Iterator[torch.Tensor]:
        """The next token of every row, (B, 1) int64, up to max_new_tokens times (`steps`' ids)."""
        return (s.ids for s in self.steps(idx, max_new_tokens, draw, eos_id, use_cache, processors))

    def generate(self, idx: torch.Tensor, max_new_tokens: int, draw: Draw = greedy, eos_id: int | None = None,
                 use_cache: bool = True, processors: Sequence[LogitsProcessor] = ()) -> torch.Tensor:
        """Continuations of idx: (B, T0) int64 → (B, T0 + n) with n ≤ max_new_tokens; rows that
        ended are padded with eos_id. Arguments as `steps`."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, draw, eos_id, use_cache, processors)], dim=1)
