"""Attention: the layer models call, the backend interface and its implementations."""

from tokenspeed.runtime.layers.attention.base import AttentionBackend
from tokenspeed.runtime.layers.attention.layer import Attention
from tokenspeed.runtime.layers.attention.registry import create_attention_backend

__all__ = ["Attention", "AttentionBackend", "create_attention_backend"]
