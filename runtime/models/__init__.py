"""Model implementations and the architecture registry."""

from tokenspeed.runtime.models.registry import MODEL_REGISTRY, get_model_class

__all__ = ["MODEL_REGISTRY", "get_model_class"]
