# Put first on PYTHONPATH, this makes `import torch` fail as on serverless compute, which has no torch.
raise ModuleNotFoundError("No module named 'torch' (blocked by tests/support/without_torch)", name="torch")
