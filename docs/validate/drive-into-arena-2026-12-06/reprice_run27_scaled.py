"""Run 27 priced again by the code of a0463eb with its calibrated drive figures scaled to the arena's rates: the
figures times the ratios measured on 2026-12-06 between 64 MiB requests into arena slots and into torch.empty
buffers (read 2.3, write and mixed 2.25), and ``nvme_small_page_factors`` their inverses, so that stock is priced at
the figures run 27 measured; once with its ``io_contention`` as calibrated and once with none. Not a prospective
result (the ratios are another day's): it says what the change would have done to run 27. Run from the repository
root (about a minute):

    python docs/validate/drive-into-arena-2026-12-06/reprice_run27_scaled.py > docs/validate/drive-into-arena-2026-12-06/reprice_run27_scaled.txt
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

RUN = "docs/validate/fp32-2026-12-05-run27-profiled"
READ, WRITE = 2.3, 2.25

with tempfile.TemporaryDirectory() as scratch:
    for contention in (None, 0.0):
        copy = os.path.join(scratch, "run27")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(RUN, copy)
        for path in glob.glob(os.path.join(copy, "machine*.json")):
            with open(path) as handle:
                machine = json.load(handle)
            machine["nvme_read_bytes_per_s_per_drive"] *= READ
            machine["nvme_write_bytes_per_s_per_drive"] *= WRITE
            machine["nvme_mixed_bytes_per_s_per_drive"] *= WRITE
            machine["nvme_small_page_factors"] = [1 / READ, 1 / WRITE, 1 / WRITE]
            if contention is not None:
                machine["io_contention"] = contention
            with open(path, "w") as handle:
                json.dump(machine, handle, indent=2)
        out = os.path.join(scratch, "out")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, "scripts/validate_estimate.py", "--reprice", copy, "--out", out], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "table.md")) as handle:
            table = handle.read()
        again = table[table.index("Re-priced") if "Re-priced" in table else 0:]
        repriced = table.split("| configuration | arm | ")[-1]
        print(f"== io_contention {'as calibrated' if contention is None else contention}")
        for line in repriced.splitlines():
            if line.startswith("| gpt2"):
                print(line)
        print(re.findall(r"Re-priced, within 15%: .*", table)[-1])
