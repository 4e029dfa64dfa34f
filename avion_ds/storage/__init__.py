"""Files of runs and from elsewhere, below models and data: run directories and tags, restricted
checkpoint loading, TorchScript checks, streamed safetensors."""
