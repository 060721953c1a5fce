"""The staged format: staging.py writes it with Spark (no torch), staged.py reads it on the ranks (no Spark)."""
