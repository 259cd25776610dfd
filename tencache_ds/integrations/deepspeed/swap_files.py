"""The optimizer swap folder's file layout. Owns: the swap files' names (stock's, so that a checkpoint copies the
folder file by file and stock's loader reads it), the order of sub-group ids, where a load stages a file of a
sub-group the swapper does not have, and what a load's copy of a checkpoint places (``LoadPlaces``). No DeepSpeed
import: the swapper (optimizer_swapper.py), the checkpoint paths (checkpoint.py, saved_layout.py) and
``tencache-ds checkpoint-for-cpu`` read these facts here.
"""
import enum
import re
from typing import Optional

from ...io.stale_files import hidden_name, hidden_parts

# The swap files' names (stock's, optimizer_utils.py): ``<ds_id>.tensor.swp`` for a sub-group's fp32 master,
# ``<state>-<ds_id>.tensor.swp`` for its optimizer state (the state dict's key: ``exp_avg``, ``momentum_buffer``,
# or a client optimizer's own); ``<ds_id>`` is "<first>_<last>" parameter ids. Gradient files
# (``<ds_id>_gradient_<offset>_<numel>.tensor.swp``) do not match.
# A hidden name (".<...>") is none: the files a process makes beside them (io/stale_files.py ``hidden_name``) end with
# the name they stand in for.
SWAP_FILE_NAME = re.compile(r"^(?!\.)(?:(?P<state>.+)-)?(?P<id>\d+_\d+)\.tensor\.swp$")


def sub_group_order(sub_group: str):
    """Sort key of sub-group ids ("<first>_<last>" parameter ids): stage 3's order of its sub-groups."""
    return tuple(int(part) for part in sub_group.split("_"))


def swap_file_name(sub_group: str, state: Optional[str] = None) -> str:
    """The name SWAP_FILE_NAME parses: sub-group ``sub_group``'s master, or its optimizer state ``state``."""
    return f"{state}-{sub_group}.tensor.swp" if state else f"{sub_group}.tensor.swp"


# The ``hidden_name`` kinds of the files a load leaves in the swap folder until adoption renames them: those it
# stages, and those adoption is renaming (checkpoint.py). A start removes what a killed process left of either.
STAGED_LOAD_KIND = "loading"
ADOPTING_KIND = "adopting"


def staged_load_name(name: str) -> str:
    """Where a load puts a checkpoint's swap file ``name`` of a sub-group the swapper does not have, until adoption
    renames it (TencacheOptimizerSwapper.load_target_name): hidden, so saves and loads skip it."""
    return hidden_name(name, STAGED_LOAD_KIND)


# what ``staged_load_name`` gave before 2026-12-07: such leftovers are still dropped after a load
_STAGED_LOAD_PREFIX_BEFORE = ".loading-"


def is_staged_load(name: str) -> bool:
    """Whether ``name`` is a ``staged_load_name`` (of any process, or of a version before process ids in names)."""
    parts = hidden_parts(name)
    return (parts is not None and parts[0] == STAGED_LOAD_KIND) or name.startswith(_STAGED_LOAD_PREFIX_BEFORE)


# The last words of every refusal of a load with the optimizer on NVMe: they come when the engine copies the swap
# folder (engine.py load_checkpoint), after its _load_checkpoint set what the load asked of it (the module's state but
# for a universal checkpoint, the lr scheduler and the step counts but for a load of the module only), which a
# refusal here cannot take back
LOAD_REFUSED = ("No swap file was placed and no optimizer state set, but what the engine's load sets first (the "
                "module's state, the lr scheduler, the step counts, as asked) may be the checkpoint's already: load "
                "one that fits before training on.")


class LoadPlaces(enum.Enum):
    """What the engine's copy of a checkpoint's swap files over the folder places, by what the load loads (the
    engine copies the whole folder whatever was asked: engine.py ``load_checkpoint``):
    - ALL: the optimizer's state is loaded;
    - MASTERS: it is not (``load_optimizer_states=False``), so the live state (Adam's moments, with its step counts)
      stays, as with the optimizer on cpu. What such a load asks for, never what a copy places: saved_layout sets
      the fp32 masters from the weights the module's load set by name before the copy, and answers NOTHING (the
      checkpoint's master files, placed by position until 2026-12-07, scrambled a model registered in another
      order: helper-192);
    - NOTHING: the module only: stage 3 has already set the masters from the loaded weights before the copy
      (``refresh_fp32_params``), as stock CPU offload has them; the checkpoint's would replace them (in bf16 with
      other values) until checkpoint.masters_from_loaded_weights set them again, and be left behind under the
      checkpoint's ids in a rebuilt engine (which adopts nothing in a module-only load);
    - STATE_WRITTEN: no file either: the checkpoint has none (saved with the optimizer on cpu, or universal), and the
      optimizer's state was written into this engine's sub-groups from its other files instead (its ZeRO file:
      zero_file.load_state_from_zero_file; a universal checkpoint's: universal.load_state_from_universal)."""
    ALL = "all"
    MASTERS = "masters"
    NOTHING = "nothing"
    STATE_WRITTEN = "state written"

    @property
    def places_files(self) -> bool:
        """Does the copy place checkpoint files in the swap folder?"""
        return self is LoadPlaces.ALL
