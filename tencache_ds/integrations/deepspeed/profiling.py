"""Profiles for the swappers: what needs DeepSpeed. Owns: which profile file a rank uses, which DeepSpeed config
facts change the access sequence, and which section of that file an optimizer swapper writes. The lifecycle itself
(recording, divergence, saving) is profile/lifecycle.py."""
import os
from typing import Optional

from deepspeed import comm as dist

from .config_source import ds_config_dict
from .engine_ordinals import LiveOrdinals


def rank_profile_path(profile_path: Optional[str]) -> Optional[str]:
    """``profile_path`` for a single process; ``<root>.rank<r><ext>`` per rank otherwise (no shared writes)."""
    if not profile_path or dist.get_world_size() == 1:
        return profile_path
    root, ext = os.path.splitext(profile_path)
    return f"{root}.rank{dist.get_rank()}{ext}"


# the swappers recording in each profile file, per kind of store; one closed frees its section
_SECTIONS = {kind: LiveOrdinals(lambda swapper: getattr(swapper, "closed", False)) for kind in ("params", "optimizer")}


def profile_section(kind: str, profile_file: Optional[str], swapper) -> str:
    """The section of ``profile_file`` that ``swapper`` (``kind``: "params" or "optimizer") records its profile in:
    the kind for the first swapper of that kind alive in this process, "<kind>-2" for a second one alive beside it
    (an actor and a critic trained at once: two optimizers; and two parameter swappers where the engines have
    nvme_paths of their own), and so on (engine_ordinals.py). One section shared by two swappers would hold each
    one's profile in turn: each run would find the other's, stale, and profile again (helper-162, helper-169)."""
    # (by the file: "runs/p.json" and "./runs/p.json" are one: helper-174)
    ordinal = _SECTIONS[kind].claim(os.path.abspath(profile_file) if profile_file else None, swapper)
    return kind if ordinal == 0 else f"{kind}-{ordinal + 1}"


def param_sequence_facts(ds_config) -> dict:
    """The DeepSpeed settings that change the order in which parameter partitions are fetched in a step, for the
    profile's fingerprint: gradient accumulation (forward and backward repeat per micro step) and DeepSpeed's
    activation checkpointing block (recomputed forwards fetch again). Activation checkpointing switched on in the
    model itself (e.g. Hugging Face ``gradient_checkpointing_enable()``) is not visible to the swapper: a change
    there shows up as a divergence at run time (profile/lifecycle.py), and the profile is then re-recorded.

    And the micro-batch size, which keeps the order but not the compute between accesses that the reads ahead are
    planned from: a profile timed at another micro-batch was reused for good (helper-234; a loaded profile is never
    re-timed while its order repeats). The sequence length is not in the config: a profile timed at another one
    serves until re-recorded (docs/configuration.md, profile_path)."""
    raw = ds_config_dict(ds_config) or {}
    return {"gradient_accumulation_steps": getattr(ds_config, "gradient_accumulation_steps",
                                                   raw.get("gradient_accumulation_steps")),
            "train_micro_batch_size_per_gpu": getattr(ds_config, "train_micro_batch_size_per_gpu",
                                                      raw.get("train_micro_batch_size_per_gpu")),
            "activation_checkpointing": raw.get("activation_checkpointing")}
