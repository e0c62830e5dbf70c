"""Model architectures: catalog and Hugging Face config import."""

from simulator.models.arch import ModelConfig
from simulator.models.catalog import CATALOG, from_hf_config, get_model, model_names

__all__ = ["CATALOG", "ModelConfig", "from_hf_config", "get_model", "model_names"]
