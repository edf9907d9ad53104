"""Loading Hugging Face checkpoints: config, safetensors shards, dummy weights."""

from tokenspeed.runtime.model_loader.config import HFConfig, load_hf_config
from tokenspeed.runtime.model_loader.errors import ModelLoadError
from tokenspeed.runtime.model_loader.loader import load_model, resolve_dtype

__all__ = ["HFConfig", "ModelLoadError", "load_hf_config", "load_model", "resolve_dtype"]
