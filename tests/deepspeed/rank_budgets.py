"""scripts/train.py with rank 1 given other tencache budgets than rank 0: ranks whose readings differ on purpose.
Takes train.py's arguments; TENCACHE_TEST_RANK1_BLOCK (a JSON object) is merged into rank 1's --tencache-block."""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    if int(os.environ.get("RANK", "0")) == 1:
        at = argv.index("--tencache-block") + 1
        block = json.loads(argv[at])
        block.update(json.loads(os.environ["TENCACHE_TEST_RANK1_BLOCK"]))
        argv[at] = json.dumps(block)
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
