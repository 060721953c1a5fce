# Put first on PYTHONPATH, this makes `import deepspeed` fail as on serverless compute, which has no deepspeed.
raise ModuleNotFoundError("No module named 'deepspeed' (blocked by tests/support/without_torch)", name="deepspeed")
