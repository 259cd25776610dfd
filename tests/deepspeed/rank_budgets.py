"""scripts/train.py with rank 1 given other tencache budgets than rank 0: ranks whose readings differ on purpose.
Takes train.py's arguments; TENCACHE_TEST_RANK1_BLOCK (a JSON object) is merged into rank 1's --tencache-block, and
rank 1 writes its tencache stats after its steps to the result file's path + ".rank1" (the test sees that the ranks
did differ: rank 0 alone writes the result)."""
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
        steps = train.run_steps

        def run_steps_then_say_stats(engine, *args):
            records = steps(engine, *args)
            import tencache_ds
            result_file = argv[argv.index("--result-file") + 1]
            train.write_result(result_file + ".rank1", tencache_ds.stats(engine))
            return records

        train.run_steps = run_steps_then_say_stats
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
