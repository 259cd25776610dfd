"""Profiles for the swappers: which file a rank uses and when a step's order becomes the profile. Owns: the glue
between the stores' StepRecorders and profile/store.py. Logic (recording, Belady) lives in the stores."""
import os
from typing import Callable, Hashable, List, Optional

from deepspeed import comm as dist

from ...plan.next_use import NextUseIndex
from ...profile import store as profile_store


def rank_profile_path(profile_path: Optional[str]) -> Optional[str]:
    """``profile_path`` for a single process; ``<root>.rank<r><ext>`` per rank otherwise (no shared writes)."""
    if not profile_path or dist.get_world_size() == 1:
        return profile_path
    root, ext = os.path.splitext(profile_path)
    return f"{root}.rank{dist.get_rank()}{ext}"


class ProfiledOrder:
    """The access order one store uses for eviction: loaded from the profile file when it was recorded for the
    same tensors, else recorded during the first training step and saved.

    ``end_step(order)`` is called with each finished step's order; ``training_step_index`` says which of those
    is the first real training step (earlier ones are initialisation)."""

    def __init__(self, path: Optional[str], section: str, training_step_index: int,
                 to_file: Callable[[Hashable], Hashable] = lambda key: key,
                 from_file: Callable[[Hashable], Hashable] = lambda key: key):
        self._path = path
        self._section = section
        self._training_step_index = training_step_index
        self._to_file, self._from_file = to_file, from_file
        self._steps_ended = 0
        self._fingerprint: Optional[str] = None
        self.index: Optional[NextUseIndex] = None
        self.source = "none"  # "loaded", "recorded" or "none"

    def load(self, *facts) -> Optional[NextUseIndex]:
        """Fingerprint the tensors (``facts``) and use a saved order recorded for the same ones, if any."""
        self._fingerprint = profile_store.fingerprint(*facts)
        order = profile_store.load_section(self._path, self._section, self._fingerprint)
        if order is not None:
            self.index = NextUseIndex([self._from_file(key) for key in order])
            self.source = "loaded"
        return self.index

    def end_step(self, order: Optional[List[Hashable]]) -> Optional[NextUseIndex]:
        step, self._steps_ended = self._steps_ended, self._steps_ended + 1
        if step != self._training_step_index or not order or self.source == "loaded":
            return self.index
        self.index = NextUseIndex(order)
        self.source = "recorded"
        if self._fingerprint is not None:
            profile_store.save_section(self._path, self._section, self._fingerprint,
                                       [self._to_file(key) for key in order])
        return self.index
