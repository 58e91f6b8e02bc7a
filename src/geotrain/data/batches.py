"""Token tensors of the world and random training batches of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geotrain.data.tokenizer import ALPHABET, CharTokenizer, TokenizerError
from geotrain.data.world import build_world


@dataclass(frozen=True)
class WorldTokens:
    """Train and validation token ids (1-D int64 tensors) of one world, and the tokenizer used."""

    train: torch.Tensor
    val: torch.Tensor
    tokenizer: CharTokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def world_tokens(seed: int = 0) -> WorldTokens:
    """The world of `seed`, tokenized with the fixed alphabet."""
    world = build_world(seed)
    tokenizer = CharTokenizer(ALPHABET)
    return WorldTokens(torch.tensor(tokenizer.encode(world.train_text()), dtype=torch.long),
                       torch.tensor(tokenizer.encode(world.val_text()), dtype=torch.long), tokenizer)


def get_batch(tokens: torch.Tensor, batch_size: int, context: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows of `context` tokens (x) and the same windows shifted by one (y).

    Both are int64 of shape (batch_size, context); start offsets come from `generator` only.
    """
    if tokens.dim() != 1 or tokens.numel() < context + 1:
        raise TokenizerError(f"need a 1-D token tensor of at least context+1={context + 1} tokens, "
                             f"got shape {tuple(tokens.shape)}")
    starts = torch.randint(tokens.numel() - context, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(context + 1)
    windows = tokens[offsets]
    return windows[:, :-1], windows[:, 1:]
