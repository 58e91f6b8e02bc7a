"""Data: the synthetic world (tiny GPT demos), and real corpora for any model.

Real data: `load_corpus(PATH)` (text / jsonl / token file -> train and validation ids),
`prepare_token_file` (text tokenized once into a token file + JSON sidecar), `replica_batch`
(batches as a pure function of data seed, step and replica).
"""

from geotrain.data.batches import WorldTokens, get_batch, world_tokens
from geotrain.data.corpus import Corpus, load_corpus, prepare_token_file, tokenize_documents, val_start_for
from geotrain.data.sampling import WINDOW_MODES, batch_starts, replica_batch, window_count, window_ids, window_starts
from geotrain.data.sources import DataError, Document, read_documents, source_files
from geotrain.data.text_tokenizers import ByteTokenizer, HFTokenizer, TextTokenizer, load_text_tokenizer
from geotrain.data.token_file import read_token_file, sidecar_path, write_token_file
from geotrain.data.tokenizer import ALPHABET, CharTokenizer, TokenizerError
from geotrain.data.world import Person, Town, World, build_world

__all__ = [
    "ALPHABET",
    "ByteTokenizer",
    "CharTokenizer",
    "Corpus",
    "DataError",
    "Document",
    "HFTokenizer",
    "Person",
    "TextTokenizer",
    "TokenizerError",
    "Town",
    "World",
    "WINDOW_MODES",
    "WorldTokens",
    "batch_starts",
    "build_world",
    "get_batch",
    "load_corpus",
    "load_text_tokenizer",
    "prepare_token_file",
    "read_documents",
    "read_token_file",
    "replica_batch",
    "sidecar_path",
    "source_files",
    "tokenize_documents",
    "val_start_for",
    "window_count",
    "window_ids",
    "window_starts",
    "world_tokens",
]
