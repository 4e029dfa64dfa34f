"""DeepSpeed training / evaluation engine: the one ds_config builder, parallelize (activation
checkpointing + deepspeed.initialize), optimizer groups, schedule, losses, metrics, checkpoints,
export and a clean distributed exit. Submodules import torch/deepspeed lazily where it matters."""
