"""Distributed training on Databricks: compute guards, bundle validation, training core and engine launchers."""

__version__ = "0.1.0"
