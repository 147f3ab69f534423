"""The shared policy helpers of app.models.policy."""

import torch
from torch import nn

from app.models.policy import disable_dropout


class Attention(nn.Module):
    """Reads a float ``attention_dropout`` in its forward, as transformers' attention modules do."""

    def __init__(self, attention_dropout: float):
        super().__init__()
        self.attention_dropout = attention_dropout

    def forward(self, x):
        return nn.functional.dropout(x, self.attention_dropout if self.training else 0.0)


def test_disable_dropout_makes_every_dropout_the_identity_in_train_mode():
    network = nn.Sequential(nn.Dropout(0.3), Attention(0.2), nn.Dropout2d(0.1), nn.Dropout(0.0), nn.Identity()).train()
    x = torch.randn(2, 3, 4, 5)
    assert not torch.equal(network(x), x)
    assert disable_dropout(network) == ["0", "1", "2"]  # the one already at 0 is not counted
    assert network.training and torch.equal(network(x), x)
    assert disable_dropout(network) == []
