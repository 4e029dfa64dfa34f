"""Normalisation statistics by ``data.mean_std`` name: what the frames are normalised with
(:class:`avion_ds.data.augment.DeviceAugment`) and what each pretrained format declares its weights were
trained with (``LoadReport.mean_std``, :mod:`avion_ds.models.weights.report`). Kept in the lowest layer
because both the data and the model packages name them.
"""

from __future__ import annotations

# On 0-1 pixels. ``openai`` is AVION's ``--norm-style openai`` (its scripts' numbers on 0-255 pixels):
# OpenAI CLIP's std and green / blue means, but a red mean of 108.33 where CLIP's ``clip`` has 122.77;
# AVION's released dual encoders and their fine-tunes were trained with it.
_AVION_OPENAI_255 = ((108.3272985, 116.7460125, 104.0937362), (68.5005327, 66.6321579, 70.3231631))
MEAN_STD: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # VideoMAE / timm
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),  # OpenAI CLIP
    "openai": tuple(tuple(v / 255 for v in part) for part in _AVION_OPENAI_255),  # AVION
}
ORIGIN = {"imagenet": "ImageNet, VideoMAE", "clip": "OpenAI CLIP", "openai": "AVION's openai"}


def describe_mean_std(name: str | None) -> str:
    """``mean/std imagenet (ImageNet, VideoMAE): mean 0.485,0.456,0.406 std ...`` for a ``MEAN_STD`` name;
    what a load line says when the weights do not state theirs (None)."""
    if name is None:
        return "mean/std: not stated by the weights' format"
    mean, std = MEAN_STD[name]
    return (
        f"mean/std {name} ({ORIGIN[name]}: mean {','.join(f'{v:.3f}' for v in mean)}, "
        f"std {','.join(f'{v:.3f}' for v in std)})"
    )


def mean_std_mismatch(recipe_value: str, weights_value: str | None) -> str | None:
    """One line when the recipe's ``data.mean_std`` differs from the weights' own, else None. The recipe's
    value is kept (a deliberate choice, e.g. a fine-tune continuing another normalisation)."""
    if weights_value is None or recipe_value == weights_value:
        return None
    return (
        f"data.mean_std={recipe_value} but the pretrained weights were trained with {weights_value} "
        f"({ORIGIN[weights_value]}): frames are normalised with {recipe_value}; set data.mean_std={weights_value} "
        "to match them"
    )
