"""Planning with fewer tokens: token merging (ToMe) and patch dropout (FLIP) as planner choices.

Both change what the model computes, so :func:`plan_fewer_tokens` adds one only when the user allows it
(``model.plan_may_merge_tokens`` / ``--may-merge-tokens``, ``model.plan_may_drop_patches`` /
``--may-drop-patches``) and nothing fits without it, the mildest setting that fits first, merging before
dropout (merging keeps every patch's content in the merged tokens; dropout discards patches). A model that
already merges or drops (the recipe's ``model.token_merge`` / ``model.patch_dropout``) is planned as it is.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from avion_ds.memory.estimate import MemoryEstimate, arch_info, estimate
from avion_ds.memory.plan import Candidate, Request, plan
from avion_ds.models.token_merge import merge_schedule, schedule_problem

MERGE_KEEP = (0.75, 0.5, 0.25)  # the tokens the last block keeps, mildest merging first
DROP_CHOICES = (0.25, 0.5, 0.75)  # patch dropout the planner may try, mildest first (FLIP trains at 0.5 and 0.75)


def merge_choices(req: Request, patch_dropout: float = 0.0) -> list[int]:
    """The ``r`` (tokens merged after every block) the planner may try, mildest first: the last block keeps
    about 3/4, 1/2, then 1/4 of the tokens (as far as every block has the tokens to merge)."""
    info = arch_info(req.model, req.frames, req.size)
    patches = (req.frames // info.tubelet_size) * (req.size // info.patch_size) ** 2
    dropout = patch_dropout or info.patch_dropout
    if dropout > 0:
        patches = max(1, int(patches * (1 - dropout)))
    cls = info.pool == "cls"
    out: list[int] = []
    for keep in MERGE_KEEP:
        r = math.ceil(patches * (1 - keep) / info.depth)
        if r > 0 and r not in out and schedule_problem(r, info.depth, patches + int(cls), cls) is None:
            out.append(r)
    return out


def _estimating(req: Request, token_merge: int | list[int], patch_dropout: float, rlt: bool = False) -> Request:
    """``req`` with its candidates estimated on the model that merges ``token_merge`` tokens per block and
    drops ``patch_dropout`` of the patches in training (``rlt``: run-length tokenization, at its worst case)."""
    info = arch_info(req.model, req.frames, req.size)
    info = dataclasses.replace(
        info,
        token_merge=tuple(merge_schedule(token_merge, info.depth)),
        patch_dropout=float(patch_dropout),
        rlt=bool(rlt),
    )

    def fewer(micro: int, dtype: str, stage: int, **knobs: Any) -> MemoryEstimate:
        return estimate(info, req.frames, req.size, micro, dtype, stage, **knobs)

    return dataclasses.replace(req, estimator=fewer)


def plan_with(
    req: Request, token_merge: int | list[int] = 0, patch_dropout: float = 0.0, rlt: bool = False
) -> tuple[list[Candidate], dict[str, Any]]:
    """:func:`plan` for the model with ``token_merge`` / ``patch_dropout`` / run-length tokenization (``rlt``,
    estimated at its worst case: no patch dropped); its candidates carry the first two (recipe overrides)."""
    if not token_merge and not patch_dropout and not rlt:
        return plan(req)
    cands, facts = plan(_estimating(req, token_merge, patch_dropout, rlt))
    for c in cands:
        c.token_merge, c.patch_dropout = token_merge, patch_dropout
    return cands, {**facts, "token_merge": token_merge, "patch_dropout": patch_dropout}


def plan_fewer_tokens(
    req: Request,
    may_merge: bool = False,
    token_merge: int | list[int] = 0,
    may_drop: bool = False,
    patch_dropout: float = 0.0,
    rlt: bool = False,
) -> tuple[list[Candidate], dict[str, Any]]:
    """The plan for ``req`` (module doc): as the recipe sets merging and dropout; when nothing fits and the
    user allows it, the mildest merging, else the mildest patch dropout, with which a candidate fits
    (``facts["merged_by_planner"]`` / ``facts["dropped_by_planner"]``). A task with its own estimator
    (``Request.estimator``) is planned as it is. With run-length tokenization (``rlt``) the plan is its worst
    case, and neither merging nor dropout is added (neither combines with it)."""
    if req.estimator is not None:
        return plan(req)
    cands, facts = plan_with(req, token_merge, patch_dropout, rlt)
    if rlt or any(c.fits for c in cands):
        return cands, facts
    if may_merge and not token_merge:
        for r in merge_choices(req, patch_dropout):
            merged, merged_facts = plan_with(req, r, patch_dropout)
            if any(c.fits for c in merged):
                return merged, {**merged_facts, "merged_by_planner": True}
    if may_drop and not patch_dropout:
        for p in DROP_CHOICES:
            dropped, dropped_facts = plan_with(req, token_merge, p)
            if any(c.fits for c in dropped):
                return dropped, {**dropped_facts, "dropped_by_planner": True}
    return cands, facts
