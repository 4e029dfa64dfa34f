"""avion_ds: memory-efficient DeepSpeed training of large video Vision Transformers."""

__version__ = "0.1.0"
