"""A checkpoint saved with the optimizer on NVMe made loadable with the optimizer on cpu (``tencache-ds
checkpoint-for-cpu TAG_FOLDER``). Owns: writing the optimizer state a tencache checkpoint keeps in its swap files
(``offloaded_tensors/rankNN/``: Adam's moments) into its ZeRO files, in place of the meta tensors that describe it
there (checkpoint_save.swapped_state_described; the empty tensors of a tencache checkpoint saved before those).

Why: a user who moves a run to a machine with more memory resumes with ``offload_optimizer.device`` cpu, often
without tencache. That load reads the ZeRO files only, and stops on the meta tensors (torch: "Cannot copy out of
meta tensor; no data!"); the masters are there already. After this, stock CPU offload loads the checkpoint's
optimizer state as it loads its own (and DeepSpeed's checkpoint tools read the moments). Offline, once, on the
checkpoint: training never pays for it (a save that wrote the moments would write all the optimizer state every
time). The swap files stay, so a load with the optimizer on NVMe reads the checkpoint as before.

Which files are whose: the swap files are named by sub-group id (``<state>-<first>_<last>.tensor.swp``), the ZeRO
file's state by index, and neither order says the other (sub-groups go parameter group by parameter group, ids in
the model's order: Hugging Face's decay and no-decay groups interleave them), nor does a rank folder's name say
which ZeRO file it belongs to (global or node-local rank, the ZeRO file's data-parallel rank). So a sub-group's
files are the ones whose master holds the ZeRO file's master, byte for byte, in any rank folder.
"""
import hashlib
import itertools
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from deepspeed.checkpoint.constants import FP32_FLAT_GROUPS, OPTIMIZER_STATE_DICT

from ...errors import TencacheError
from ...io.durable import replace_durably
from ...io.stale_files import pid_in_name, remove_files_of_dead_processes
from ...log import logger
from .swap_files import SWAP_FILE_NAME, swap_file_name
from .zero_file import holds_no_bytes, load_mapped

# stage 3's ZeRO files as the engine names them (_get_rank_zero_ckpt_name, and the older name its loader still reads)
ZERO_FILE_NAME = re.compile(r"^(?:bf16_)?zero_pp_rank_\d+_mp_rank_\d+_?optim_states\.pt$")
_PROBE_BYTES = 4096  # a master's first bytes, to find the swap file that holds it without reading every master whole
NOTHING_CHANGED = "Nothing was changed."
FILLING = ".filling-"  # <ZeRO file>.filling-<host>-<pid>: a ZeRO file being written, renamed over it when whole


@dataclass
class Converted:
    """What ``fill_zero_files`` did: ZeRO files rewritten, state tensors written into them, their bytes."""
    files: List[str] = field(default_factory=list)
    tensors: int = 0
    bytes: int = 0


def _remove_leftovers(tag_folder: str, zero_files: List[str]) -> None:
    """ZeRO files a run of this command killed while writing left under their temporary name (no loader reads them;
    each is the size of its ZeRO file with the moments in): removed once their process is gone, or, written on
    another host (a shared file system: its process cannot be seen from here), once nothing has written them for an
    hour (io/stale_files.py)."""
    def owner(name: str):  # (pid, host) of <ZeRO file>.filling-<host>-<pid>, or None
        for zero_file in zero_files:
            if name.startswith(zero_file + FILLING):
                host, dash, pid = name[len(zero_file + FILLING):].rpartition("-")
                pid = pid_in_name(pid, "") if dash and host else None
                return None if pid is None else (pid, host)
        return None

    def pid_of(name: str) -> Optional[int]:
        found = owner(name)
        return None if found is None else found[0]

    def host_of(name: str) -> Optional[str]:
        found = owner(name)
        return None if found is None else found[1]

    for path in remove_files_of_dead_processes(tag_folder, pid_of, host_of):
        logger.info("checkpoint-for-cpu: removed %s, left by a run that did not finish", path)


@dataclass
class _MasterFile:
    folder: str
    sub_group: str
    size: int
    taken: bool = False


def fill_zero_files(tag_folder: str) -> Converted:
    """Write the swapped optimizer state of every ZeRO file in ``tag_folder`` (``<save_dir>/<tag>``) from the
    checkpoint's swap files into the file itself. A ZeRO file with nothing described (saved with the optimizer on
    cpu, or filled already) is left as it is. Raises, before any file of the checkpoint is changed, where the swap
    files cannot be paired with what the ZeRO files describe. Then ZeRO files an earlier run left half-written under
    their temporary names, which no loader reads, are removed, before the first ZeRO file is written."""
    if not os.path.isdir(tag_folder):  # (not "holds no ZeRO-3 optimizer file": helper-244)
        raise TencacheError(f"checkpoint-for-cpu: {tag_folder} " + (
            "is not a folder" if os.path.exists(tag_folder) else "does not exist") + "; give a checkpoint's tag folder")
    names = sorted(name for name in os.listdir(tag_folder) if ZERO_FILE_NAME.match(name))
    if not names:
        raise TencacheError(f"checkpoint-for-cpu: {tag_folder} holds no ZeRO-3 optimizer file "
                            f"(zero_pp_rank_*_mp_rank_*_optim_states.pt); give a checkpoint's tag folder")
    master_files = _master_files(os.path.join(tag_folder, "offloaded_tensors"))
    done, filled = Converted(), []
    for name in names:  # every file checked and paired before any is written
        zero_file = os.path.join(tag_folder, name)
        saved, tensors, nbytes = _filled(zero_file, master_files)
        if tensors:
            filled.append((zero_file, saved))
            done.files.append(zero_file)
            done.tensors += tensors
            done.bytes += nbytes
    _remove_leftovers(tag_folder, names)  # every ZeRO file paired: the checkpoint is changed from here on
    written = []
    for zero_file, saved in filled:
        temporary = f"{zero_file}{FILLING}{socket.gethostname()}-{os.getpid()}"
        try:
            torch.save(saved, temporary)
            # never a half-written ZeRO file under its name, nor, after a crash, one whose bytes never reached the drive
            replace_durably(temporary, zero_file)
            written.append(zero_file)
        except Exception as err:  # (torch.save's RuntimeError on a full disk too: helper-166's review)
            raise TencacheError(
                f"checkpoint-for-cpu: writing {zero_file} failed ({type(err).__name__}: {err}); {len(written)} of "
                f"{len(filled)} ZeRO files were written ({', '.join(written) or 'none'}), each whole, the others "
                f"unchanged: free room and run the command again to finish") from err
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    logger.info("checkpoint-for-cpu: %d optimizer state tensors (%d bytes) written into %d ZeRO files of %s",
                done.tensors, done.bytes, len(done.files), tag_folder)
    return done


def _master_files(folder: str) -> Dict[bytes, List[_MasterFile]]:
    """The masters' swap files of every rank folder under ``folder``, by a digest of their first bytes."""
    found: Dict[bytes, List[_MasterFile]] = {}
    for rank_folder in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, rank_folder)
        for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            match = SWAP_FILE_NAME.match(name)
            if match and match["state"] is None:
                with open(os.path.join(path, name), "rb") as handle:
                    key = hashlib.sha256(handle.read(_PROBE_BYTES)).digest()
                found.setdefault(key, []).append(_MasterFile(path, match["id"], os.path.getsize(handle.name)))
    return found


def _filled(zero_file: str, master_files: Dict[bytes, List[_MasterFile]]):
    """(the ZeRO file's content with its described state mapped from the swap files, tensors, bytes)."""
    try:
        saved = load_mapped(zero_file)
    except Exception as err:  # pylint: disable=broad-except  (unpickling raises anything)
        raise TencacheError(f"checkpoint-for-cpu: {zero_file} cannot be read ({type(err).__name__}: {err}). "
                            f"{NOTHING_CHANGED}") from err
    stage3 = saved.get(OPTIMIZER_STATE_DICT) or {}
    masters, torch_state = stage3.get(FP32_FLAT_GROUPS), stage3.get(OPTIMIZER_STATE_DICT) or {}
    state = torch_state.get("state", {})
    if masters is not None and any(master is None or master.numel() == 0 or master.is_meta for master in masters):
        # (stock NVMe's, saved before its first step, describes no state either: "nothing to do" was said of it, and
        # stock CPU offload's load then stopped on the empty master: helper-166's review)
        raise TencacheError(
            f"checkpoint-for-cpu: {zero_file} holds a sub-group's fp32 master without its bytes: it was saved by "
            f"DeepSpeed's own NVMe offload, whose ZeRO file has none; only checkpoints saved under tencache_ds can be "
            f"converted. {NOTHING_CHANGED}")
    # the torch optimizer numbers the masters in group order, which is the sub-groups' order (stage 3 builds them
    # group by group): the n-th id is the n-th master
    position = {saved_id: n for n, saved_id in enumerate(
        itertools.chain.from_iterable(group["params"] for group in torch_state.get("param_groups", [])))}
    tensors = nbytes = 0
    for saved_id, entries in state.items():
        described = {key: value for key, value in entries.items() if holds_no_bytes(value)}
        if not described:
            continue
        master = masters[position[saved_id]] if masters is not None and saved_id in position else None
        if master is None or master.numel() == 0 or master.is_meta:
            raise TencacheError(
                f"checkpoint-for-cpu: {zero_file} holds no fp32 master for sub-group {saved_id}, whose optimizer "
                f"state it holds without bytes: it was saved by DeepSpeed's own NVMe offload, whose ZeRO file has "
                f"neither; only checkpoints saved under tencache_ds can be converted. {NOTHING_CHANGED}")
        found = _file_of(master, master_files, described, zero_file, saved_id)
        if found is None:
            raise TencacheError(
                f"checkpoint-for-cpu: no swap file under {os.path.dirname(zero_file)}/offloaded_tensors holds the fp32 "
                f"master of sub-group {saved_id} of {zero_file}: the checkpoint's swap files are missing or another "
                f"checkpoint's. {NOTHING_CHANGED}")
        for key, placeholder in described.items():
            path = os.path.join(found.folder, swap_file_name(found.sub_group, key))
            # a meta tensor says the state's dtype; an empty placeholder (saved before them) the masters' is all
            dtype = placeholder.dtype if placeholder.is_meta else master.dtype
            size = master.numel() * torch.empty((), dtype=dtype).element_size()
            if not os.path.isfile(path) or os.path.getsize(path) < size:
                raise TencacheError(f"checkpoint-for-cpu: {path} should hold {key!r} of sub-group {saved_id} of "
                                    f"{zero_file} ({size} bytes) and does not. {NOTHING_CHANGED}")
            entries[key] = torch.from_file(path, shared=False, size=master.numel(), dtype=dtype)
            tensors += 1
            nbytes += size
    return saved, tensors, nbytes


def _file_of(master: torch.Tensor, master_files: Dict[bytes, List[_MasterFile]], keys, zero_file: str,
             saved_id) -> Optional[_MasterFile]:
    """The swap file, not taken yet, whose first bytes are ``master``'s, byte for byte; taken. Where several are (two
    sub-groups with the same master), their ``keys`` files must be alike too, else which is which is unknown."""
    data = master.contiguous().view(torch.uint8)
    if data.numel() >= _PROBE_BYTES:
        candidates = master_files.get(hashlib.sha256(data[:_PROBE_BYTES].numpy().tobytes()).digest(), [])
    else:  # smaller than the probe (a small aio.block_size): the files' first bytes run past it
        candidates = list(itertools.chain.from_iterable(master_files.values()))
    matches = [candidate for candidate in candidates if not candidate.taken and candidate.size >= data.numel()
               and torch.equal(_mapped(candidate, None, data.numel()), data)]
    if not matches:
        return None
    for other in matches[1:]:
        if not all(torch.equal(_mapped(matches[0], key, data.numel()), _mapped(other, key, data.numel()))
                   for key in keys):
            raise TencacheError(
                f"checkpoint-for-cpu: the fp32 master of sub-group {saved_id} of {zero_file} is in two swap files, "
                f"{matches[0].sub_group} and {other.sub_group} under {matches[0].folder} and {other.folder}, whose "
                f"optimizer state differs: which is this sub-group's is unknown. {NOTHING_CHANGED}")
    matches[0].taken = True
    return matches[0]


def _mapped(master_file: _MasterFile, key: Optional[str], size: int) -> torch.Tensor:
    """The first ``size`` bytes of ``master_file``'s sub-group's file of state ``key`` (None: the master), mapped."""
    path = os.path.join(master_file.folder, swap_file_name(master_file.sub_group, key))
    if os.path.getsize(path) < size:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
