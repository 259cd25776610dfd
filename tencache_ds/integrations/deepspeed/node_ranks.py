"""How many of the job's ranks share this node's memory, where no launcher variable says (probes/limits.py). Owns:
the one collective that counts them (every rank's node key, all-gathered), run once per process by the swappers'
construction: every rank builds its swappers at the same point (zero.Init, ZeRO-3's __init__), after DeepSpeed set
the rank's device and before any host budget is read. deepspeed.initialize's own check comes before the device is
set (an NCCL collective there could run every rank on GPU 0), so it counts nothing: until counted, the guess from
WORLD_SIZE only divides shares (limits.ranks_on_node_known).

Why: a launcher that sets WORLD_SIZE and nothing of the node (a Kubeflow PyTorchJob running plain python, Lightning
or mp.spawn across nodes) made every rank take the whole job for its node: on 64 ranks the memory governor's reserve
was 64 step rises, it gave back the whole host tier and stopped the run with TencacheOutOfMemory where stock trains
(helper-184's review).
"""
import hashlib
import socket

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

from ...probes.limits import note_ranks_on_node, ranks_on_node_told
from .agreement import world_size

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def node_key() -> int:
    """This node as a 63-bit number: its host name and its kernel's boot. Ranks of one container or pod share both;
    pods on one machine share the kernel, not the name, and each has a memory cgroup of its own; machines that share
    a host name (containers on the host's network) differ by their boots."""
    try:
        with open(BOOT_ID_FILE) as boot_file:
            boot = boot_file.read().strip()
    except OSError:
        boot = ""
    digest = hashlib.sha256(f"{socket.gethostname()}\0{boot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def ranks_sharing(keys, mine: int) -> int:
    """Of the ranks' node keys, how many are this rank's node (itself included)."""
    return max(1, sum(1 for key in keys if key == mine))


def count_ranks_on_node() -> None:
    """Count the ranks on this node once (a collective: every rank calls it at the same point), unless a launcher
    said or torch.distributed is not up (one process). Also where WORLD_SIZE is not set either (a script that
    initialised torch.distributed itself: every rank took itself for the node's only one, helper-188)."""
    if ranks_on_node_told() or not dist.is_initialized():
        return
    ranks = world_size()
    if ranks <= 1:
        note_ranks_on_node(1)
        return
    import torch  # a collective needs a tensor on the communication device (CPU for gloo, the GPU for NCCL)

    mine = node_key()
    local = torch.tensor([mine], dtype=torch.int64, device=get_accelerator().current_device_name())
    gathered = [torch.empty_like(local) for _ in range(ranks)]
    dist.all_gather(gathered, local)
    note_ranks_on_node(ranks_sharing([int(key.item()) for key in gathered], mine))
