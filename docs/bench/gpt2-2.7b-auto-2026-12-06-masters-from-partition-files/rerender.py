"""bench.md again from this folder's runs, with the least bytes of 2026-12-06's fix (bench/report_bound.py
``_masters_filled``: a master filled from partitions on file is read all the same): the run's own table is
bench-as-run.md (its least counted those 9.7 GiB a step as no read: 1.19x the least, 1.73x the bound). The same
measurements; run from the repository root: python docs/bench/gpt2-2.7b-auto-2026-12-06-masters-from-partition-files/rerender.py"""
import os
from tencache_ds.bench import report
from tencache_ds.bench.records import read_json_record
here = os.path.dirname(os.path.abspath(__file__))
bench = read_json_record(os.path.join(here, "bench.json"))
runs = [report.BenchRun(r["arm"], r["repeat"], report.load_result(os.path.join(here, os.path.basename(r["result"]))),
                        report.load_metrics_rows(os.path.join(here, os.path.basename(r["metrics"]))) if r["metrics"] else ())
        for r in bench["runs"] if r["returncode"] is not None]
rates = bench["nvme_bandwidth"]
bandwidth = report.NvmeBandwidth(rates["read_bytes_per_s"], rates["write_bytes_per_s"], rates["source"],
                                 rates.get("combined_bytes_per_s"))
comparison = report.compare(runs, bench["settings"]["warmup"], bandwidth, drive_tbw_bytes=None, ranks_per_drive=1)
comparison.notes.append("--micro-batch 1 replaces the config's train_micro_batch_size_per_gpu 2, in every arm")
commands = [" ".join(r["command"]) for r in bench["runs"] if r["command"]]
markdown = report.render_markdown(comparison, bench["command_line"], bench["machine"], commands, bench["figure"],
                                  bench["figure_note"], bench["constant_series"])
open(os.path.join(here, "bench.md"), "w").write(markdown)
print(report.render_table(comparison))
