"""Fresh host memory written after a pause: allocate and fill N MiB (every page faulted in), free it, wait, again.
Wall and the thread's CPU time per fill, by the pause before it (free page reporting returns freed memory to the
host a couple of seconds after it is freed; the next touch of it then exits to the hypervisor)."""
import sys, time, statistics, torch
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 512
def fill():
    w, c = time.perf_counter(), time.thread_time()
    t = torch.empty(MIB << 18); t.fill_(1.0)
    w, c = time.perf_counter() - w, time.thread_time() - c
    del t
    return w, c
def steal():
    return int(open("/proc/stat").readline().split()[8])
for pause in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 0.0):
    rows = []
    for _ in range(4):
        time.sleep(pause)
        s0 = steal(); w, c = fill(); s1 = steal()
        rows.append((w, c, s1 - s0))
    print(f"pause {pause:4.1f} s: fill {MIB} MiB wall " + " ".join(f"{w:.3f}" for w, _, _ in rows)
          + f" | GB/s median {MIB * 1.048576e-3 / statistics.median(w for w, _, _ in rows):.2f}"
          + " | thread cpu " + " ".join(f"{c:.3f}" for _, c, _ in rows) + " | steal ticks " + " ".join(str(s) for _, _, s in rows), flush=True)
