"""Train with TorchDistributor: DDP, one process per GPU; the launcher of distributor.py as it is."""

from .distributor import TorchDistributorEngine

ENGINE = TorchDistributorEngine()
