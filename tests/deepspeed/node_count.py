"""scripts/train.py launched as a launcher that says nothing of the node does it (WORLD_SIZE, RANK and LOCAL_RANK
only: a Kubeflow PyTorchJob running plain python, Lightning or mp.spawn across nodes): the deepspeed launcher's
LOCAL_SIZE is taken out of the environment. TENCACHE_TEST_SPLIT_NODES=1 puts every rank on a node of its own (its
node key made from its rank), as on several machines. TENCACHE_TEST_NO_WORLD_SIZE=1 takes WORLD_SIZE out too once
torch.distributed is up (a script that initialised it itself, with no variable of the launch left). Prints ``NODE_RANKS rank=R local=N known=K`` once trained:
what the host budgets and the memory governor were built on (probes/limits.py). Takes train.py's arguments."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402

from tencache_ds.integrations.deepspeed import node_ranks  # noqa: E402
from tencache_ds.probes.limits import LOCAL_WORLD_SIZE_ENVS, local_world_size, ranks_on_node_known  # noqa: E402


def main() -> int:
    for name in LOCAL_WORLD_SIZE_ENVS:
        os.environ.pop(name, None)
    rank = int(os.environ["RANK"])
    if os.environ.get("TENCACHE_TEST_SPLIT_NODES") == "1":
        node_ranks.node_key = lambda: 1000 + rank
    if os.environ.get("TENCACHE_TEST_NO_WORLD_SIZE") == "1":
        start = train.start_distributed

        ranks = int(os.environ["WORLD_SIZE"])

        def started_then_forgotten():
            start()
            os.environ.pop("WORLD_SIZE")
        train.start_distributed = started_then_forgotten
        train.world_size = lambda: ranks  # (train.py's own batch size and loss average read the variable)
    code = train.main(sys.argv[1:])
    print(f"NODE_RANKS rank={rank} local={local_world_size()} known={ranks_on_node_known()}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
