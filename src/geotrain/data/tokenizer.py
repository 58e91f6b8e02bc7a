"""A fixed 44-character alphabet and the character tokenizer over it."""

from __future__ import annotations

from collections.abc import Iterable

from geotrain.errors import GeotrainError

ALPHABET: str = "\n ',-.0123456789:?abcdefghijklmnopqrstuvwxyz"
"""Newline, space, 6 punctuation marks (' , - . : ?), 10 digits, 26 lowercase letters: 44 characters."""


class TokenizerError(GeotrainError, ValueError):
    """Text holds a character outside the alphabet, or an id is outside the vocabulary."""


class CharTokenizer:
    """One token per character; token id = position of the character in `alphabet`."""

    def __init__(self, alphabet: str = ALPHABET) -> None:
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise TokenizerError(f"alphabet must be non-empty with distinct characters, got {alphabet!r}")
        self.alphabet = alphabet
        self._ids = {ch: i for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; raises TokenizerError naming the first unknown character and its offset."""
        try:
            return [self._ids[ch] for ch in text]
        except KeyError:
            for offset, ch in enumerate(text):
                if ch not in self._ids:
                    raise TokenizerError(f"character {ch!r} at offset {offset} is not in the alphabet") from None
            raise

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids (ints or a 1-D integer tensor)."""
        chars = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.alphabet):
                raise TokenizerError(f"token id {i} is outside 0..{len(self.alphabet) - 1}")
            chars.append(self.alphabet[i])
        return "".join(chars)
