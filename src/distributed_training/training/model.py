"""The model: a small multilayer perceptron that maps a trip's normalised features to its normalised fare."""

from __future__ import annotations

import torch
from torch import nn


class FareRegressor(nn.Module):
    def __init__(self, in_features: int, hidden_sizes: tuple[int, ...] = (64, 64)):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(batch, in_features) -> (batch,)"""
        return self.layers(features).squeeze(-1)
