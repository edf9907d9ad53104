"""Torch REFERENCE implementations: the meaning of every op.

They are what CPU runs and what every other kernel is compared with. They favour clarity
and float32 accumulation over speed, but stay vectorised (no Python loop per token).
"""
