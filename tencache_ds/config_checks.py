"""Checks of a parsed "tencache" block against the machine it will run on. Owns: "can this budget or path work
here?" answered before the run writes anything, and leaving nothing behind. Does not own: the block's own keys
and types (config.py) or DeepSpeed's sections (zero_sections.py; integrations/deepspeed/config_bridge.py calls
both).

A file the block names (metrics_path, profile_path) is tried for real: permission bits say nothing to root, and
some folders accept no new file whatever they say (/proc, /sys, a name too long), so the check creates the file's
missing folders and a probe file in the last one, then removes both. The nvme_path is only looked at here; the
swappers create and probe it (config_bridge.prepare_swap_folder).

Leaf module: imports neither torch nor deepspeed, so `tencache-ds doctor` can use it too.
"""
import os
import uuid
from typing import Optional

from .config import AUTO, CONFIG_KEY, TencacheConfig
from .errors import TencacheConfigError, TencacheResourceError
from .plan.budget import UNLIMITED, MachineResources
from .profile.store import foreign_file_reason, rank_files
from .units import fmt_bytes


def check_host_budget(config: TencacheConfig, machine: MachineResources) -> None:
    """An explicit host_cache_bytes is per rank, and the ranks of a node share its memory. Above the node's
    physical memory it is a typo (a unit, a zero too many), not a plan: nothing could ever hold it, and the run
    would instead swap or be killed by the OOM killer. With "pin_memory": "required" the budget must also fit
    what the machine has now: this rank's share of the available memory, and the memlock limit (per process),
    since any of it may become pinned parameter slots. (With "best_effort" resolve_budgets and the parameter
    store lower it instead where slots are locked, and log why; on the CPU accelerator nothing is locked.)"""
    budget = config.host_cache_bytes
    if budget == AUTO:
        return
    # (a guessed count, every rank of the job, would refuse a budget that fits each node: the swappers check again
    # once the ranks on the node are counted, before anything is written)
    ranks = 1 if machine.local_world_size_guessed else max(1, machine.local_world_size)
    node = budget * ranks
    per_node = "" if ranks == 1 else f" per rank, x {ranks} ranks on this node = {node} ({fmt_bytes(node)}),"
    if node > machine.host_total_bytes:
        raise TencacheConfigError(
            f"{CONFIG_KEY}.host_cache_bytes = {budget} ({fmt_bytes(budget)}){per_node} is more than "
            f"{machine.host_memory_name} ({fmt_bytes(machine.host_total_bytes)}): use \"auto\" (25% of the memory available "
            f"at start-up, shared by the ranks of a node) or a size well below the physical memory")
    if config.pin_memory != "required":
        return
    if node > machine.host_available_bytes:
        raise TencacheResourceError(
            f"{CONFIG_KEY}.host_cache_bytes = {budget} ({fmt_bytes(budget)}){per_node} is more than the memory "
            f"available now ({machine.host_available_bytes} bytes, {fmt_bytes(machine.host_available_bytes)}) and "
            f"\"pin_memory\" is \"required\": lower it to at most {machine.host_available_per_rank_bytes} bytes "
            f"per rank, use \"auto\", or set \"pin_memory\": \"best_effort\" (the budget is then lowered to fit)")
    limit = machine.memlock_limit_bytes
    if limit != UNLIMITED and budget > limit:
        raise TencacheResourceError(
            f"{CONFIG_KEY}.host_cache_bytes = {budget} ({fmt_bytes(budget)}) is more than this process may "
            f"page-lock (memlock limit {limit} bytes, {fmt_bytes(limit)}, `ulimit -l`, per process) and "
            f"\"pin_memory\" is \"required\": raise the limit (`ulimit -l unlimited`, docker --ulimit "
            f"memlock=-1), lower the budget below {fmt_bytes(limit)} minus the streaming slots, or set "
            f"\"pin_memory\": \"best_effort\" (the cache is then fitted to the limit)")


def check_output_paths(config: TencacheConfig) -> None:
    """metrics_path and profile_path: files tencache creates (with their folders) during the run."""
    for key in ("metrics_path", "profile_path"):
        path = getattr(config, key)
        if path:  # the profile is replaced whole (a file written beside it, renamed over it: profile/store.py)
            check_output_file(f"{CONFIG_KEY}.{key}", path, replaced=key == "profile_path")
    if config.profile_path:
        _refuse_foreign_profile_files(config.profile_path)
    if config.metrics_path and config.profile_path and \
            os.path.abspath(config.metrics_path) == os.path.abspath(config.profile_path):
        raise TencacheConfigError(
            f"{CONFIG_KEY}.metrics_path and {CONFIG_KEY}.profile_path are the same file ({config.metrics_path!r}): "
            f"the metrics lines would corrupt the profile; give them different names")


def _refuse_foreign_profile_files(path: str) -> None:
    """The file a run would replace with its profile is none of the user's other files: ``path``, and at several
    ranks each rank's ``<root>.rank<r><ext>`` (integrations/deepspeed/profiling.py), where they exist."""
    for name in [path] + rank_files(path):
        reason = foreign_file_reason(name)
        if reason is not None:
            named = "" if name == path else f" (the file a rank of a multi-rank job writes for it: {name!r})"
            raise TencacheResourceError(
                f"{CONFIG_KEY}.profile_path = {path!r}{named}: the file exists and {reason}; a run replaces that "
                f"file with its profile. Name a new file for the profile, or delete this one if it is yours to lose")


def check_output_file(key: str, path: str, replaced: bool = False) -> None:
    """``path`` is a file we may create or append to (its missing folders are created by the writer): tried by
    creating its missing folders and a probe file beside it, all removed again. ``replaced``: a file written beside
    it and renamed over it, so its folder must take a new file even where it exists (helper-225: an existing
    profile, writable, in a folder that was not passed, and every save of it failed with a warning)."""
    _refuse_nul(key, path)
    refuse_tilde(key, path, "tencache would write into")
    absolute = os.path.abspath(path)
    # a trailing separator names a folder even where none exists yet (abspath drops it, and the check would then
    # probe the parent while the writer's open fails after the first step)
    if os.path.isdir(absolute) or path.endswith(tuple(filter(None, (os.sep, os.altsep)))):
        raise TencacheResourceError(f"{key} = {path!r} is a folder; name a file inside it, "
                                    f"e.g. {os.path.join(path, 'tencache.json')!r}")
    if os.path.exists(absolute):
        if not os.access(absolute, os.W_OK):
            raise TencacheResourceError(f"{key} = {path!r} exists and is not writable by this user: "
                                        f"fix its permissions or choose another path")
        _try_writing(key, path, "cannot open it for appending",
                     lambda: open(absolute, "ab").close())  # appends nothing: the file is unchanged
        if not replaced:
            return
    folder = os.path.dirname(absolute)
    _check_creatable(key, path, folder)
    _check_name_length(key, path, folder, os.path.basename(absolute))
    _try_writing(key, path, f"cannot create a file in {folder}",
                 lambda: _probe_file(folder, os.path.basename(absolute)))


def _check_name_length(key: str, path: str, folder: str, name: str) -> None:
    """The file's own name fits the file system's limit (the probe's name may be shorter: helper-219)."""
    ancestor = _nearest_existing(folder)
    try:
        limit = os.pathconf(ancestor, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(name)) > limit:
        raise TencacheResourceError(f"{key} = {path!r} is not usable: its file name is {len(os.fsencode(name))} "
                                    f"bytes, more than the {limit} a name may have there; choose a shorter name")


def _probe_file(folder: str, name: str) -> None:
    """Create a file named like ``name`` in ``folder``, or where ``folder`` is missing, a folder and a file in it in
    its nearest existing ancestor; remove them. Every name is this process's own: ranks check one path at once
    (before 2026-12-07 each made and removed the missing folders themselves, and a rank met another's mkdir or rmdir:
    "File exists", "No such file or directory", a start-up refused at random: helper-206)."""
    ancestor = _nearest_existing(folder)
    # a random name: the pid alone repeats across nodes' containers whose ranks check one shared folder (helper-213);
    # within a file name's 255 bytes, where a long one leaves no room for the file's own (helper-214)
    own = f".{name}.tcp-{uuid.uuid4().hex[:16]}"
    if len(own.encode()) > 255:
        own = f".tencache-probe-{uuid.uuid4().hex[:16]}"
    if ancestor == folder:
        probe = os.path.join(folder, own)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.remove(probe)
        return
    made = os.path.join(ancestor, own)
    os.mkdir(made)  # (the writer makes the missing folders with its first write)
    try:
        probe = os.path.join(made, own)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.remove(probe)
    finally:
        os.rmdir(made)


def _nearest_existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists (``/`` at worst)."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _refuse_nul(key: str, path: str) -> None:
    """No path holds a NUL byte (the OS's calls raise a bare ValueError on one: helper-161's review)."""
    if "\0" in path:
        raise TencacheConfigError(f"{key} = {path!r} holds a NUL byte (\\u0000), which no file name can: remove it")


def refuse_tilde(key: str, path: str, what: str) -> None:
    """No path starts with "~": nothing expands it (DeepSpeed joins nvme_path as given), so ``what`` would go to a
    folder named "~" under the working folder, perhaps not on the drive meant (doctor FAILs it too: helper-206)."""
    if path.startswith("~"):
        raise TencacheConfigError(f"{key} = {path!r} starts with '~', which is not expanded ({what} a folder "
                                  f"named '~' under the working folder): give it as an absolute path")


def _try_writing(key: str, path: str, what: str, attempt) -> None:
    try:
        attempt()
    except OSError as err:
        raise TencacheResourceError(f"{key} = {path!r} is not usable: {what} ({err.strerror or err}); choose a "
                                    f"writable location") from None


def check_swap_folder(key: str, path: Optional[str]) -> None:
    """``path`` is an nvme_path: a folder (created if missing) that will hold the swap files."""
    if path is None or str(path) == "":
        raise TencacheConfigError(f"{key} is missing: \"device\": \"nvme\" needs a folder on the NVMe drive for "
                                  f"the swap files, e.g. \"nvme_path\": \"/local_nvme\"")
    path = str(path)
    _refuse_nul(key, path)
    refuse_tilde(key, path, "DeepSpeed would swap into")
    absolute = os.path.abspath(path)
    if os.path.exists(absolute) and not os.path.isdir(absolute):
        raise TencacheResourceError(f"{key} = {path!r} is a file, not a folder: point it at a folder on the NVMe "
                                    f"drive")
    if os.path.isdir(absolute):
        _check_writable_folder(key, path, absolute)
    else:
        _check_creatable(key, path, absolute)


def _check_creatable(key: str, path: str, folder: str) -> None:
    """``folder`` exists and is writable, or can be created: its nearest existing ancestor is a writable folder."""
    ancestor = _nearest_existing(folder)
    if not os.path.isdir(ancestor):
        raise TencacheResourceError(f"{key} = {path!r} cannot be created: {ancestor} is a file, not a "
                                    f"folder; choose a path inside a folder")
    _check_writable_folder(key, path, ancestor)


def _check_writable_folder(key: str, path: str, folder: str) -> None:
    # access() answers for this process's user, and reports a read-only file system even to root (EROFS).
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TencacheResourceError(f"{key} = {path!r} is not usable: this user cannot create files in {folder} "
                                    f"(permissions or a read-only file system); choose a writable location")


__all__ = ["check_host_budget", "check_output_paths", "check_output_file", "check_swap_folder", "refuse_tilde"]
