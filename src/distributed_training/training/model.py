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


class FarePredictor(nn.Module):
    """The trained regressor with the normalisation around it: raw features in, fares in dollars out.

    This is the model that is logged: whoever loads it needs no statistics from the staging.
    """

    def __init__(self, regressor: FareRegressor, feature_means, feature_stds, label_mean: float, label_std: float):
        super().__init__()
        self.regressor = regressor
        self.register_buffer("feature_means", torch.as_tensor(feature_means, dtype=torch.float32))
        self.register_buffer("feature_stds", torch.as_tensor(feature_stds, dtype=torch.float32))
        self.label_mean, self.label_std = float(label_mean), float(label_std)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(batch, in_features) raw -> (batch,) fares"""
        normalised = (features.to(self.feature_means.dtype) - self.feature_means) / self.feature_stds
        return self.regressor(normalised) * self.label_std + self.label_mean
