"""The CLIP byte-level BPE tokenizer of SAM 3 (upstream: sam3/model/tokenizer_ve.py).

Token ids are identical to the official tokenizer. Two of its steps need third-party packages,
which are runtime dependencies for that reason:

* ``ftfy.fix_text`` repairs mojibake, curly quotes, ligatures, full-width forms, ... before
  tokenizing; its heuristics cannot be reproduced faithfully without it;
* the word-splitting pattern uses Unicode classes ``\\p{L}`` / ``\\p{N}`` (and ``\\s`` as the
  ``White_Space`` property), which Python's ``re`` lacks: the ``regex`` package provides them.

The vocabulary (OpenAI CLIP's ``bpe_simple_vocab_16e6.txt.gz``, MIT) ships in
``paddle_sam/assets``; it is read from a local path and never downloaded.
"""

from __future__ import annotations

import gzip
import html
import os
import string
from functools import lru_cache
from pathlib import Path

import ftfy
import numpy as np
import regex

DEFAULT_BPE_PATH = Path(__file__).resolve().parents[2] / "assets" / "bpe_simple_vocab_16e6.txt.gz"
DEFAULT_CONTEXT_LENGTH = 77
# CLIP's vocabulary: 256 byte symbols, the same with "</w>", 48894 merges, 2 special tokens
NUM_MERGES = 49152 - 256 - 2
SPECIAL_TOKENS = ("<start_of_text>", "<end_of_text>")


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """A reversible map from the 256 byte values to printable unicode characters.

    Printable Latin-1 bytes map to themselves; the rest (controls, space, soft hyphen, ...)
    map to code points from 256 upwards, in byte order. The dict's order (printable bytes
    first, then the rest) is the order of the first 256 vocabulary entries.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def basic_clean(text: str) -> str:
    text = ftfy.fix_text(text)
    return html.unescape(html.unescape(text)).strip()


def whitespace_clean(text: str) -> str:
    return regex.sub(r"\s+", " ", text).strip()


def canonicalize_text(text: str) -> str:
    """Lower case, underscores to spaces, ASCII punctuation removed, whitespace collapsed."""
    text = text.replace("_", " ").translate(str.maketrans("", "", string.punctuation))
    return regex.sub(r"\s+", " ", text.lower()).strip()


_CLEANERS = {
    "lower": lambda t: whitespace_clean(basic_clean(t)).lower(),
    "whitespace": lambda t: whitespace_clean(basic_clean(t)),
    "canonicalize": lambda t: canonicalize_text(basic_clean(t)),
}


def read_merges(bpe_path: str | os.PathLike) -> list[tuple[str, str]]:
    """The merge list of a CLIP vocabulary file (gzip text: a header line, then "a b" lines)."""
    path = Path(bpe_path)
    if not path.is_file():
        raise FileNotFoundError(f"BPE vocabulary not found: {path}")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a gzip-compressed BPE vocabulary ({exc})") from exc
    merges = [tuple(line.split()) for line in lines[1 : NUM_MERGES + 1]]
    bad = [i + 2 for i, m in enumerate(merges) if len(m) != 2]
    if len(merges) != NUM_MERGES or bad:
        raise ValueError(
            f"{path} is not CLIP's BPE vocabulary: expected {NUM_MERGES} merge lines of two "
            f"symbols, found {len(merges)}" + (f" (malformed line {bad[0]})" if bad else "")
        )
    return merges  # type: ignore[return-value]


class SimpleTokenizer:
    """Text -> CLIP BPE token ids, padded with 0 to ``context_length``.

    ``tokenizer(texts, context_length)`` returns an ``N x context_length`` int64 array:
    ``<start_of_text>``, the text's tokens, ``<end_of_text>``, zeros; a text too long for the
    context is cut and its last kept token replaced by ``<end_of_text>``.
    """

    def __init__(
        self,
        bpe_path: str | os.PathLike | None = None,
        additional_special_tokens: list[str] | None = None,
        context_length: int | None = DEFAULT_CONTEXT_LENGTH,
        clean: str = "lower",
    ) -> None:
        if clean not in _CLEANERS:
            raise ValueError(f"clean must be one of {sorted(_CLEANERS)}, not {clean!r}")
        merges = read_merges(DEFAULT_BPE_PATH if bpe_path is None else bpe_path)
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        symbols = list(self.byte_encoder.values())
        vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
        special = list(SPECIAL_TOKENS) + list(additional_special_tokens or [])
        vocab += special
        self.encoder = {tok: i for i, tok in enumerate(vocab)}
        self.decoder = {i: tok for tok, i in self.encoder.items()}
        self.bpe_ranks = {m: i for i, m in enumerate(merges)}
        self.cache: dict[str, str] = {t: t for t in special}
        self.pat = regex.compile(
            "|".join(map(regex.escape, special))
            + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            regex.IGNORECASE,
        )
        self.vocab_size = len(self.encoder)
        self.all_special_ids = [self.encoder[t] for t in special]
        self.sot_token_id, self.eot_token_id = self.all_special_ids[:2]
        self.context_length = context_length
        self.clean_fn = _CLEANERS[clean]

    def bpe(self, token: str) -> str:
        """Space-separated BPE symbols of one pre-token (already mapped to byte symbols)."""
        cached = self.cache.get(token)
        if cached is not None:
            return cached
        word = [*token[:-1], token[-1] + "</w>"]
        while len(word) > 1:
            ranked = [
                (self.bpe_ranks[p], p)
                for p in zip(word, word[1:], strict=False)
                if p in self.bpe_ranks
            ]
            if not ranked:
                break
            first, second = min(ranked)[1]
            merged: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        out = " ".join(word)
        if len(self.cache) < 1 << 16:
            self.cache[token] = out
        return out

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (cleaned first), without start/end tokens."""
        ids: list[int] = []
        for piece in self.pat.findall(self.clean_fn(text)):
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[sym] for sym in self.bpe(mapped).split(" "))
        return ids

    def decode(self, tokens: list[int] | np.ndarray) -> str:
        text = "".join(self.decoder[int(t)] for t in tokens)
        raw = bytearray(self.byte_decoder[c] for c in text)
        return raw.decode("utf-8", errors="replace").replace("</w>", " ")

    def __call__(self, texts: str | list[str], context_length: int | None = None) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list | tuple) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a string or a list of strings")
        context_length = context_length or self.context_length
        if not context_length or context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {context_length!r}")
        result = np.zeros((len(texts), context_length), dtype=np.int64)
        for row, text in enumerate(texts):
            ids = [self.sot_token_id, *self.encode(text), self.eot_token_id]
            if len(ids) > context_length:
                ids = ids[:context_length]
                ids[-1] = self.eot_token_id
            result[row, : len(ids)] = ids
        return result
