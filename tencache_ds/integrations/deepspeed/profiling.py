"""Profiles for the swappers: what needs DeepSpeed. Owns: which profile file a rank uses and which DeepSpeed
config facts change the access sequence. The lifecycle itself (recording, divergence, saving) is
profile/lifecycle.py."""
import os
from typing import Optional

from deepspeed import comm as dist

from .config_source import ds_config_dict


def rank_profile_path(profile_path: Optional[str]) -> Optional[str]:
    """``profile_path`` for a single process; ``<root>.rank<r><ext>`` per rank otherwise (no shared writes)."""
    if not profile_path or dist.get_world_size() == 1:
        return profile_path
    root, ext = os.path.splitext(profile_path)
    return f"{root}.rank{dist.get_rank()}{ext}"


def param_sequence_facts(ds_config) -> dict:
    """The DeepSpeed settings that change the order in which parameter partitions are fetched in a step, for the
    profile's fingerprint: gradient accumulation (forward and backward repeat per micro step) and DeepSpeed's
    activation checkpointing block (recomputed forwards fetch again). Activation checkpointing switched on in the
    model itself (e.g. Hugging Face ``gradient_checkpointing_enable()``) is not visible to the swapper: a change
    there shows up as a divergence at run time (profile/lifecycle.py), and the profile is then re-recorded."""
    raw = ds_config_dict(ds_config) or {}
    return {"gradient_accumulation_steps": getattr(ds_config, "gradient_accumulation_steps",
                                                   raw.get("gradient_accumulation_steps")),
            "activation_checkpointing": raw.get("activation_checkpointing")}
