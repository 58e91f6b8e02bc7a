"""A user-file model (file.py:build) shared by the model and runtime tests: 4 layers, width 64, the
byte vocabulary, embedding tied to the output layer."""

USER_GPT = '''
import torch
from torch import nn


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(256, 64)
        nn.init.normal_(self.emb.weight, std=0.02)  # it is the output layer too

    def forward(self, ids):
        return self.emb(ids)


class CausalMixer(nn.Module):
    """Mixes each position with the running mean of the ones before it (causal, no attention)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.mlp = nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 64))

    def forward(self, x):
        steps = x.new_tensor(range(1, x.shape[1] + 1))[None, :, None]
        history = x.cumsum(1) / steps
        return x + self.mlp(torch.cat([self.norm(x), self.norm(history)], dim=-1))


def build():
    embed = Embed()
    head = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256, bias=False))
    head[1].weight = embed.emb.weight
    return [embed, CausalMixer(), CausalMixer(), head]
'''
