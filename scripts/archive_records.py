"""Archive the machine-written records of benches and validation runs kept in docs/: every result file and bench.json
under the folders given is replaced by its gzip form, NAME.gz (tencache_ds/bench/records.py; the tools that read
records read either). Run it on a bench's or a validation's output folder before committing it to docs/.

    python scripts/archive_records.py docs/validate/NEW_RUN docs/bench/NEW_BENCH
    python scripts/archive_records.py --check docs          # lists what is not archived; exit 1 if anything

Why: the records were three fifths of the working tree, which the device tool does not send above 64 MiB.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tencache_ds.bench.records import archive, is_archivable  # noqa: E402


def plain_records(folders):
    """The plain records under ``folders``, sorted, each once (a folder given beside one inside it lists the inner
    one's records twice, and the second archive of a record found its plain file gone)."""
    found = {}
    for folder in folders:
        if not os.path.isdir(folder):
            raise SystemExit(f"archive_records: {folder} is not a folder")
        for root, _dirs, files in os.walk(folder):
            for name in files:
                if is_archivable(name):
                    path = os.path.join(root, name)
                    found.setdefault(os.path.realpath(path), path)
    return sorted(found.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--check", action="store_true", help="list the plain records; archive nothing")
    args = parser.parse_args(argv)
    records = plain_records(args.folders)
    if args.check:
        for path in records:
            print(path)
        if records:
            print(f"{len(records)} records not archived: python scripts/archive_records.py "
                  f"{' '.join(args.folders)}", file=sys.stderr)
        return 1 if records else 0
    before = after = 0
    for path in records:
        before += os.path.getsize(path)
        after += os.path.getsize(archive(path))
    print(f"archived {len(records)} records: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
