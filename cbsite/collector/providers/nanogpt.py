"""`nanogpt`: a GPT-2-style decoder written here, the transformer counterpart of the recsys providers.

Module names follow GPT-2 (`wte`, `wpe`, `blocks.N.attn.c_attn`, `mlp.c_fc`, `ln_f`, `lm_head`), so a
profile reads like the GPT-2 code people know. `lm_head` shares its weight with `wte`, as GPT-2 does:
a realistic shared parameter the collector must count once.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cbsite.collector.providers import Inputs, OptionCheck, Provided, batch_seed, resolve_options

NAME = "nanogpt"

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(batch_size=2, seq_len=16, vocab_size=128, n_layer=2, n_head=2, n_embd=32, dropout=0.0),
    "small": dict(batch_size=4, seq_len=64, vocab_size=2048, n_layer=4, n_head=4, n_embd=128, dropout=0.0),
    # GPT-2 small (124M parameters; vocab padded to a multiple of 64 as nanoGPT does).
    "medium": dict(batch_size=8, seq_len=512, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, dropout=0.0),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # query, key and value in one matmul
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Functional dropout keeps the module tree to the GPT-2 names; p is 0 by default.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.c_proj(self.gelu(self.c_fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids `(B, T)` -> logits `(B, T, vocab_size)`; T is at most `block_size`."""

    def __init__(
        self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, dropout: float
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.dropout = dropout
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        # GPT-2's init: N(0, 0.02), residual projections scaled down by depth so activations stay bounded.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds the block size {self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def provide(options: dict[str, Any], *, batches: int = 1, seed: int = 0) -> Provided:
    """Build the decoder (block size = `seq_len`) and batches of token ids `(batch_size, seq_len)`.

    Token ids are uniform: unlike embedding tables, a transformer's cost does not depend on which
    tokens it reads.
    """
    opts = resolve_options(NAME, options, PRESETS, seed)
    check = OptionCheck(NAME, opts)
    batch_size = check.integer("batch_size")
    seq_len = check.integer("seq_len")
    vocab_size = check.integer("vocab_size")
    n_layer = check.integer("n_layer")
    n_head = check.integer("n_head")
    n_embd = check.integer("n_embd")
    dropout = check.number("dropout", 0.0)
    check.require(dropout < 1.0, "dropout", "use a probability in [0, 1)")
    check.require(n_embd % n_head == 0, "n_embd", f"must be a multiple of n_head={n_head}")
    check.integer("seed", 0)
    check.done()
    opts["dropout"] = dropout

    with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's RNG
        torch.manual_seed(opts["seed"])
        model = GPT(vocab_size, seq_len, n_layer, n_head, n_embd, dropout)
    inputs = []
    for index in range(batches):
        g = torch.Generator().manual_seed(batch_seed(opts["seed"], index))
        inputs.append(Inputs(args=(torch.randint(vocab_size, (batch_size, seq_len), generator=g),)))
    description = (
        f"GPT-2-style decoder: {n_layer} layers, {n_head} heads, {n_embd} dims, vocab {vocab_size}, "
        f"batch {batch_size} x {seq_len} tokens, lm_head tied to wte"
    )
    return Provided(model=model, inputs=inputs, name=NAME, options=opts, description=description)
