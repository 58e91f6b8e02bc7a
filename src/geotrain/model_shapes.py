"""Published shapes of common decoder-only transformers, for job files (`model: llama-7b`) and presets.

Each shape gives what the planner needs: parameters, layers, hidden size, attention heads, vocabulary,
context length (seq_len) and the published global batch in sequences (tokens per batch / seq_len).
Sources:
- gpt3-xl: Brown et al., "Language Models are Few-Shot Learners", NeurIPS 2020, Table 2.1 (GPT-3 XL:
  1.3B params, 24 layers, d_model 2048, 24 heads of 128, context 2048, batch 1M tokens = 512
  sequences); vocabulary 50257 (GPT-2 BPE, Radford et al. 2019).
- llama-7b / llama-13b: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
  arXiv:2302.13971 (2023), Table 2 (6.7B: dim 4096, 32 heads, 32 layers; 13.0B: dim 5120, 40 heads,
  40 layers; batch 4M tokens) and Section 2 (context 2048, vocabulary 32000 SentencePiece tokens).
Sizes in parameters (not bytes); the embedding holds vocab x hidden of them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """A model's published dimensions; `citation` says where they come from."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    global_batch: int
    citation: str

    def job_fields(self) -> dict:
        """The Job fields this shape sets (a job file's own keys override them)."""
        return {"params": self.params, "layers": self.layers, "hidden": self.hidden, "vocab": self.vocab,
                "seq_len": self.seq_len, "global_batch": self.global_batch}


MODEL_SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("gpt3-xl", 1.3e9, 24, 2048, 24, 50257, 2048, 512,
                   "Brown et al. 2020, GPT-3 paper, Table 2.1 (GPT-3 XL)"),
        ModelShape("llama-7b", 6.7e9, 32, 4096, 32, 32000, 2048, 2048,
                   "Touvron et al. 2023, LLaMA paper (arXiv:2302.13971), Table 2"),
        ModelShape("llama-13b", 13.0e9, 40, 5120, 40, 32000, 2048, 2048,
                   "Touvron et al. 2023, LLaMA paper (arXiv:2302.13971), Table 2"),
    )
}
