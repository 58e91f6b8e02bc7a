"""The synthetic world (text about people and towns), its 44-character tokenizer and training batches."""

from geotrain.data.batches import WorldTokens, get_batch, world_tokens
from geotrain.data.tokenizer import ALPHABET, CharTokenizer, TokenizerError
from geotrain.data.world import Person, Town, World, build_world

__all__ = [
    "ALPHABET",
    "CharTokenizer",
    "Person",
    "TokenizerError",
    "Town",
    "World",
    "WorldTokens",
    "build_world",
    "get_batch",
    "world_tokens",
]
