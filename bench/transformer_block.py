"""A pre-norm transformer block in plain PyTorch (hidden 512, 8 heads, FFN 2048, sequence 64 by default): a model
as a user writes it, smaller than BERT-base's layers, for `tensortune tune-model bench/transformer_block.py:make`."""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden=512, heads=8, ffn=2048):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def split(self, x):
        b, s, h = x.shape
        return x.view(b, s, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x):
        y = self.norm1(x)
        attention = F.scaled_dot_product_attention(self.split(self.q(y)), self.split(self.k(y)), self.split(self.v(y)))
        x = x + self.o(attention.transpose(1, 2).reshape(x.shape))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def make(seq_len=64):
    """The block with random weights, and an input of one sequence."""
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(1, seq_len, 512),)
