"""Tokenizers: characters (the default) or a tiktoken BPE encoding, plus start and end of poem.

Both give ids `0` = `<bos>`, `1` = `<eos>`, then the vocabulary, then any plan tokens
(`plan`: labels such as `<七律>`, `<下平聲七陽>`, from `data/verse/plan.py`; no text, never produced
by `encode`), and share one interface: `encode`, `decode`, `token_bytes`, `char_counts`,
`vocab_size`, `known_characters`, `state_dict` (it travels inside every checkpoint;
`tokenizer_from_state` rebuilds either kind from it; a state without "plan" has none).
Text coming in passes `check_code_points` (the one check of incoming text); ids going out
pass `check_ids` (every decode path refuses ids outside `[0, vocab_size)`).

- `CharTokenizer`: one id per corpus character, in code-point order.
- `TiktokenTokenizer`: a tiktoken encoding (`cl100k_base`, `o200k_base`, `gpt2`, ... or a
  local `.tiktoken` ranks file) whose token ids are remapped to the compact range of the
  tokens that occur in the corpus, so the embedding has rows only for those.

`StreamDecoder` turns ids into text one token at a time without splitting a character.
"""
from __future__ import annotations

import codecs
import hashlib
import json
import socket
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator
from urllib.parse import urlparse

if TYPE_CHECKING:
    import tiktoken

BOS, EOS = "<bos>", "<eos>"
SPECIALS = (BOS, EOS)
NETWORK_TIMEOUT_S = 5  # how long to wait for the host of an encoding that is not cached


def _code_points(chars: list[str]) -> str:
    return ", ".join(f"U+{ord(c):04X}" for c in chars[:10]) + (", …" if len(chars) > 10 else "")


class UnknownCharactersError(ValueError):
    """Raised when text holds characters outside the vocabulary; `.unknown` lists them.
    option: where the text came from (`prompt`, `acrostic`, ...), named first in the message."""

    def __init__(self, unknown: list[str], hint: str = "", option: str = ""):
        self.unknown, self.option = unknown, option
        shown = "".join(unknown[:50]) + ("…" if len(unknown) > 50 else "")
        super().__init__(
            (f"{option}: " if option else "")
            + f"{len(unknown)} character(s) are not in the model's vocabulary: {shown} ({_code_points(unknown)}). "
            "Remove or replace them; the vocabulary is the training corpus's characters."
            + (f" {hint}" if hint else "")
        )


class InvalidCodePointsError(UnknownCharactersError):
    """Raised for text holding code points that are not characters: lone surrogates
    (U+D800–U+DFFF), which UTF-8 cannot encode. Bytes of a command line that are not UTF-8
    reach Python as U+DC80–U+DCFF (`surrogateescape`); the message shows them as bytes."""

    def __init__(self, bad: list[str], option: str = "text"):
        ValueError.__init__(self, "")
        self.unknown, self.option = bad, option
        raw = [f"{ord(c) - 0xDC00:02X}" for c in bad if 0xDC80 <= ord(c) <= 0xDCFF]
        self.args = (
            f"{option}: {len(bad)} code point(s) are not characters (lone surrogates, which UTF-8 cannot encode): "
            f"{_code_points(bad)}" + (f"; they stand for the bytes {' '.join(raw)}, which are not UTF-8" if raw else "")
            + ". Give the text as UTF-8.",
        )


def check_code_points(text: str, option: str = "text") -> str:
    """The one check of every text entering the product (prompt, acrostic, probe lines,
    attention-map text, `Tokenizer.encode`): returns `text` if all its code points are
    characters. option: the text's name, for the message.
    raises InvalidCodePointsError naming the option and the offending code points."""
    if bad := [c for c in dict.fromkeys(text) if 0xD800 <= ord(c) <= 0xDFFF]:
        raise InvalidCodePointsError(bad, option)
    return text


class EncodingUnavailableError(FileNotFoundError):
    """Raised when a tiktoken encoding is neither cached nor downloadable; says how to provide it."""


class Tokenizer(ABC):
    """What both tokenizers share. Ids are `int` in `[0, vocab_size)`; `bos_id` = 0, `eos_id` = 1;
    the plan tokens' ids are `[plan_start, vocab_size)`."""

    bos_id, eos_id = 0, 1
    plan: tuple[str, ...] = ()
    """Labels of the plan tokens (`data.verse.plan.plan_labels`), in id order after the text vocabulary."""

    @property
    @abstractmethod
    def plan_start(self) -> int:
        """The first plan token's id: the number of text ids, `<bos>` and `<eos>` included."""

    @property
    def vocab_size(self) -> int:
        """Number of ids: `<bos>`, `<eos>`, the text vocabulary and the plan tokens."""
        return self.plan_start + len(self.plan)

    def is_plan(self, i: int) -> bool:
        """Whether id i is a plan token."""
        return self.plan_start <= i < self.vocab_size

    @property
    @abstractmethod
    def known_characters(self) -> frozenset[str] | None:
        """The characters of the text the vocabulary was built from (the model's script as it was
        trained), or None where not recorded (BPE tokenizers saved by older versions)."""

    @abstractmethod
    def unknown(self, text: str) -> list[str]:
        """Characters of `text` that cannot be encoded, in order of first appearance."""

    @abstractmethod
    def _token_bytes(self, i: int) -> bytes:
        """`token_bytes` for an id already checked (b"" for specials and plan tokens)."""

    @abstractmethod
    def _ids(self, text: str) -> list[int]:
        """`encode` for a text already checked, without `<bos>` / `<eos>`."""

    def check_ids(self, ids: Iterable[int]) -> list[int]:
        """ids as a list of `int`. raises IndexError listing the ids outside `[0, vocab_size)`."""
        ids = [int(i) for i in ids]
        if bad := list(dict.fromkeys(i for i in ids if not 0 <= i < self.vocab_size)):
            shown = ", ".join(map(str, bad[:10])) + (", …" if len(bad) > 10 else "")
            raise IndexError(f"token id(s) {shown} outside the vocabulary's range [0, {self.vocab_size})")
        return ids

    def token_bytes(self, i: int) -> bytes:
        """The UTF-8 bytes of id `i` (empty for `<bos>`/`<eos>` and plan tokens); may be part of a character.
        raises IndexError for an id outside `[0, vocab_size)`."""
        return self._token_bytes(self.check_ids([i])[0])

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """text → ids, optionally framed by `<bos>` / `<eos>`.

        raises InvalidCodePointsError (`check_code_points`), UnknownCharactersError listing
        every character the vocabulary cannot spell.
        """
        if missing := self.unknown(check_code_points(text)):
            raise UnknownCharactersError(missing)
        return [self.bos_id] * bos + self._ids(text) + [self.eos_id] * eos

    @abstractmethod
    def state_dict(self) -> dict:
        """JSON-able state with a "kind", stored in checkpoints; `tokenizer_from_state` inverts it."""

    @property
    def char_counts(self) -> list[int]:
        """(vocab_size,) characters each id begins (its UTF-8 lead bytes); summed over the ids of
        a text, the text's number of characters, even where a token holds part of a character."""
        return [sum(not 0x80 <= b < 0xC0 for b in self.token_bytes(i)) for i in range(self.vocab_size)]

    def label(self, i: int) -> str:
        """Id i as a readable label (plot ticks): its text, `<bos>`/`<eos>`, a plan token's label
        (`<七律>`), or its bytes in hex (`<e5 ba>`) where a BPE token holds only part of a character."""
        if i in (self.bos_id, self.eos_id):
            return SPECIALS[i]
        if self.is_plan(i):
            return self.plan[i - self.plan_start]
        try:
            return self.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            return f"<{self.token_bytes(i).hex(' ')}>"

    def decode(self, ids: Iterable[int], skip_specials: bool = True) -> str:
        """ids → text; `<bos>`/`<eos>` and plan tokens are dropped unless `skip_specials=False`
        (then written as their labels). Bytes that do not form a character (a sequence cut
        short) become U+FFFD. raises IndexError listing the ids outside `[0, vocab_size)`."""
        out = []
        for i in self.check_ids(ids):
            if i in (self.bos_id, self.eos_id) or self.is_plan(i):
                out.append(b"" if skip_specials else self.label(i).encode())
            else:
                out.append(self._token_bytes(i))
        return b"".join(out).decode("utf-8", errors="replace")

    def save(self, path: str | Path) -> None:
        """Write `state_dict()` as UTF-8 JSON to `path`; `load_tokenizer` reads it back."""
        Path(path).write_text(json.dumps(self.state_dict(), ensure_ascii=False))


class CharTokenizer(Tokenizer):
    """Maps characters to ids and back.

    chars: the vocabulary's characters (specials are added in front); plan: plan token labels
    (added after the characters). `itos` covers every id (a plan token: its label); `stoi`
    only the characters and specials, so text never encodes to a plan token.
    """

    def __init__(self, chars: Iterable[str], plan: Iterable[str] = ()):
        chars = sorted(set(chars) - set(SPECIALS))
        if any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer takes single characters")
        self.plan = tuple(plan)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate([*SPECIALS, *chars])}
        self.itos: list[str] = [*SPECIALS, *chars, *self.plan]

    @classmethod
    def from_texts(cls, texts: Iterable[str], plan: Iterable[str] = ()) -> "CharTokenizer":
        """Vocabulary = every character that occurs in `texts`, then the plan tokens `plan`."""
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        return cls(chars, plan)

    @property
    def plan_start(self) -> int:
        return len(self.stoi)

    @property
    def known_characters(self) -> frozenset[str]:
        """The vocabulary's characters (specials and plan tokens excluded)."""
        return frozenset(self.itos[len(SPECIALS):self.plan_start])

    def unknown(self, text: str) -> list[str]:
        """Characters of `text` outside the vocabulary, in order of first appearance."""
        return list(dict.fromkeys(c for c in text if c not in self.stoi))

    def _ids(self, text: str) -> list[int]:
        return [self.stoi[c] for c in text]

    def _token_bytes(self, i: int) -> bytes:
        return b"" if i < len(SPECIALS) or self.is_plan(i) else self.itos[i].encode()

    def state_dict(self) -> dict:
        """JSON-able state, stored in checkpoints; inverse of `from_state_dict`. "itos" holds the
        specials and characters; "plan" (only when there are plan tokens) their labels."""
        return {"kind": "char", "itos": self.itos[:self.plan_start], **({"plan": list(self.plan)} if self.plan else {})}

    @classmethod
    def from_state_dict(cls, state: dict) -> "CharTokenizer":
        """A state without "kind" (older checkpoints) is a character tokenizer's; one without
        "plan" has no plan tokens. raises ValueError if `state` is not a character tokenizer's state."""
        if state.get("kind", "char") != "char" or tuple(state["itos"][: len(SPECIALS)]) != SPECIALS:
            raise ValueError("not a character tokenizer state (kind must be 'char', specials first)")
        tok = cls(state["itos"][len(SPECIALS):], state.get("plan", ()))
        if tok.itos[:tok.plan_start] != state["itos"]:
            raise ValueError("character tokenizer state is not sorted; it was not written by this project")
        return tok


def ranks_file_pattern() -> str:
    """The split pattern of encodings read from a `.tiktoken` ranks file (which holds ranks only):
    tiktoken's GPT-2 pattern, which keeps a run of Chinese characters in one piece and every
    punctuation mark in its own. `data/bpe.py` learns ranks with the same pattern."""
    from tiktoken_ext.openai_public import r50k_pat_str

    return r50k_pat_str


@contextmanager
def _no_hanging_download(name: str) -> Iterator[None]:
    """While loading a named encoding: a file tiktoken would download is fetched only if its host
    answers within NETWORK_TIMEOUT_S; otherwise EncodingUnavailableError says how to provide it.
    (tiktoken reads its cache first and calls `tiktoken.load.read_file` only on a miss.)"""
    import tiktoken.load

    fetch = tiktoken.load.read_file

    def guarded(blobpath: str) -> bytes:
        url = urlparse(blobpath)
        if url.scheme in ("http", "https"):
            try:
                socket.create_connection((url.hostname, url.port or 443), timeout=NETWORK_TIMEOUT_S).close()
            except OSError as err:
                raise EncodingUnavailableError(
                    f"the tiktoken encoding {name!r} is not cached here and cannot be downloaded ({err}). "
                    f"Either run `TIKTOKEN_CACHE_DIR=<dir> python -c \"import tiktoken; tiktoken.get_encoding("
                    f"'{name}')\"` on a machine with network, copy <dir> here and set TIKTOKEN_CACHE_DIR to it, "
                    "or use a local ranks file: tokenizer.encoding=path/to/ranks.tiktoken (learn one from the "
                    "corpus with `python -m data.bpe`)."
                ) from err
        return fetch(blobpath)

    tiktoken.load.read_file = guarded
    try:
        yield
    finally:
        tiktoken.load.read_file = fetch


def load_encoding(spec: str) -> "tiktoken.Encoding":
    """A tiktoken encoding from a name (`cl100k_base`, `o200k_base`, `gpt2`, ...) or the path of a
    `.tiktoken` ranks file (one `base64(token bytes) rank` a line, all 256 single bytes included;
    split pattern: `ranks_file_pattern()`). A file's encoding is named `<file name>@<sha256[:16]>`,
    so a changed file is a different encoding; a relative path is taken from the current folder,
    and tiktoken's loader keeps a copy of the file in its cache. Named encodings come from
    tiktoken's cache (TIKTOKEN_CACHE_DIR, else a folder under the temp dir) or are downloaded
    on first use.

    raises EncodingUnavailableError (not cached, no network: within NETWORK_TIMEOUT_S),
    FileNotFoundError (no such ranks file), ValueError (unknown name, ranks without all bytes).
    """
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    path = Path(spec).expanduser()
    if path.suffix == ".tiktoken" or "/" in spec or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"ranks file {path} not found; learn one from the corpus with "
                                    f"`python -m data.bpe --out {spec}` or give an encoding name")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        ranks = load_tiktoken_bpe(str(path.resolve()), expected_hash=digest)
        if missing := [b for b in range(256) if bytes([b]) not in ranks]:
            raise ValueError(f"ranks file {path} lacks {len(missing)} of the 256 single-byte tokens; "
                             "a byte-level BPE needs all of them")
        return tiktoken.Encoding(name=f"{path.name}@{digest[:16]}", pat_str=ranks_file_pattern(),
                                 mergeable_ranks=ranks, special_tokens={})
    if spec not in tiktoken.list_encoding_names():
        raise ValueError(f"tokenizer.encoding={spec!r} is neither a tiktoken encoding "
                         f"({', '.join(tiktoken.list_encoding_names())}) nor a .tiktoken ranks file")
    with _no_hanging_download(spec):
        return tiktoken.get_encoding(spec)


class TiktokenTokenizer(Tokenizer):
    """A tiktoken BPE encoding with its ids remapped to a compact vocabulary.

    encoding: a `tiktoken.Encoding`; token_ids: the encoding's ids to keep (id `2 + k` is the
    k-th smallest of them); source: what `load_encoding` rebuilds the encoding from (a name or
    a ranks file path), stored in the checkpoint with the encoding's name; chars: the
    characters of the training text (`known_characters`), or None; plan: plan token labels,
    ids after the kept tokens. Special-token
    strings such as `<|endoftext|>` in text are encoded as plain text. A token outside the
    kept ids is encoded as its single bytes, so any text made of the corpus's characters encodes.
    """

    def __init__(self, encoding: "tiktoken.Encoding", token_ids: Iterable[int], source: str,
                 chars: Iterable[str] | None = None, plan: Iterable[str] = ()):
        self.encoding, self.source, self.plan = encoding, source, tuple(plan)
        self.chars = None if chars is None else "".join(sorted(set(chars)))  # the training text's characters
        self.token_ids: list[int] = sorted(set(token_ids))
        self._index = {t: k + len(SPECIALS) for k, t in enumerate(self.token_ids)}
        self._bytes = [b""] * len(SPECIALS) + [encoding.decode_single_token_bytes(t) for t in self.token_ids]
        self._byte_ids = {b[0]: i for i, b in enumerate(self._bytes) if len(b) == 1}  # byte value → id

    @classmethod
    def from_texts(cls, encoding: "tiktoken.Encoding", texts: list[str], source: str,
                   plan: Iterable[str] = ()) -> "TiktokenTokenizer":
        """Vocabulary = every token of `texts` encoded, plus the single-byte token of every byte in
        them, then the plan tokens `plan`."""
        token_ids = {t for ids in encoding.encode_ordinary_batch(texts) for t in ids}
        chars = set("".join(texts))
        token_ids |= {encoding.encode_single_token(bytes([b])) for b in set("".join(chars).encode())}
        return cls(encoding, token_ids, source, chars, plan)

    @property
    def plan_start(self) -> int:
        return len(self._bytes)

    @property
    def known_characters(self) -> frozenset[str] | None:
        return None if self.chars is None else frozenset(self.chars)

    def _token_bytes(self, i: int) -> bytes:
        return b"" if self.is_plan(i) else self._bytes[i]

    def unknown(self, text: str) -> list[str]:
        """Characters of `text` with a byte no kept token covers, in order of first appearance."""
        return [c for c in dict.fromkeys(text) if any(b not in self._byte_ids for b in c.encode())]

    def _ids(self, text: str) -> list[int]:
        ids = []
        for t in self.encoding.encode_ordinary(text):
            if t in self._index:
                ids.append(self._index[t])
            else:
                ids.extend(self._byte_ids[b] for b in self.encoding.decode_single_token_bytes(t))
        return ids

    def state_dict(self) -> dict:
        """JSON-able state, stored in checkpoints; inverse of `from_state_dict`."""
        return {"kind": "tiktoken", "encoding": self.source, "name": self.encoding.name, "token_ids": self.token_ids,
                **({"chars": self.chars} if self.chars is not None else {}),
                **({"plan": list(self.plan)} if self.plan else {})}

    @classmethod
    def from_state_dict(cls, state: dict) -> "TiktokenTokenizer":
        """Loads the encoding again (`load_encoding`), so it must be reachable where the checkpoint is used.
        raises ValueError if the encoding found is not the one the state was made with, or what
        `load_encoding` raises."""
        encoding = load_encoding(state["encoding"])
        if encoding.name != state["name"]:
            raise ValueError(f"the encoding at {state['encoding']} is {encoding.name}, but this model was "
                             f"trained with {state['name']}; provide the ranks file it was trained with")
        return cls(encoding, state["token_ids"], state["encoding"], state.get("chars"), state.get("plan", ()))


def tokenizer_from_state(state: dict) -> CharTokenizer | TiktokenTokenizer:
    """Rebuild a tokenizer from its `state_dict()` (a state without "kind" is a character
    tokenizer's). raises ValueError for an unknown kind."""
    kinds = {"char": CharTokenizer, "tiktoken": TiktokenTokenizer}
    kind = state.get("kind", "char")
    if kind not in kinds:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(kinds)}")
    return kinds[kind].from_state_dict(state)


def load_tokenizer(path: str | Path) -> CharTokenizer | TiktokenTokenizer:
    """Read a tokenizer written by `Tokenizer.save`."""
    return tokenizer_from_state(json.loads(Path(path).read_text()))


class StreamDecoder:
    """Incremental ids → text that never emits part of a character: the bytes of an unfinished
    UTF-8 sequence are held back until the token that completes it (Python's incremental
    UTF-8 decoder). `<bos>`/`<eos>` and plan tokens produce no text.

    >>> stream = StreamDecoder(tokenizer)
    >>> for i in ids: print(stream.feed([i]), end="", flush=True)
    >>> print(stream.flush())
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        """The text completed by `ids` (possibly ""). raises IndexError listing ids out of range."""
        tok = self.tokenizer
        return self._decoder.decode(b"".join(tok._token_bytes(i) for i in tok.check_ids(ids)))

    def flush(self) -> str:
        """End of stream: any bytes still held back, as U+FFFD; the decoder is then reset."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
