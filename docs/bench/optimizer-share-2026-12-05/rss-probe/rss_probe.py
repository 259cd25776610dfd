"""Run a script with a sampler thread: at each new RSS maximum (by >32 MiB), record the main thread's stack and
glibc's mallinfo2; write them to $RSS_PROBE_OUT at exit."""
import re, ctypes, json, os, runpy, sys, threading, time, traceback, atexit

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
main_ident = threading.get_ident()
records = []
t0 = time.monotonic()

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

def sampler():
    best = 0
    last_log = 0
    while True:
        r = rss()
        now = time.monotonic() - t0
        if r > best + (32 << 20):
            best = r
            frame = sys._current_frames().get(main_ident)
            stack = [f"{os.path.basename(fs.filename)}:{fs.lineno}:{fs.name}" for fs in traceback.extract_stack(frame)][-14:] if frame else []
            m = libc.mallinfo2()
            big = []
            if now > float(os.environ.get("RSS_PROBE_SMAPS_AFTER", "1e9")):
                cur = None
                with open("/proc/self/smaps") as f:
                    for line in f:
                        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                            a, b = line.split()[0].split("-")
                            cur = [int(b, 16) - int(a, 16), line.split()[-1] if len(line.split()) > 5 else "anon"]
                        elif line.startswith("Rss:") and cur is not None:
                            kb = int(line.split()[1])
                            if kb > 50 * 1024:
                                big.append((round(cur[0] / 2**20), round(kb / 1024), cur[1]))
            records.append({"t": round(now, 2), "big": big, "rss_gib": round(r / 2**30, 3), "heap_gib": round(m.arena / 2**30, 3),
                            "heap_free_gib": round(m.fordblks / 2**30, 3), "mmapped_gib": round(m.hblkhd / 2**30, 3),
                            "stack": stack})
        if now - last_log > 0.25:
            last_log = now
            records.append({"t": round(now, 2), "rss_gib": round(r / 2**30, 3)})
        time.sleep(0.01)

def dump():
    with open(os.environ.get("RSS_PROBE_OUT", "/tmp/probe/out.json"), "w") as f:
        json.dump(records, f)
atexit.register(dump)
threading.Thread(target=sampler, daemon=True).start()
if os.environ.get("RSS_PROBE_TRIM"):
    import deepspeed.runtime.engine as _eng
    _orig_backward = _eng.DeepSpeedEngine.backward
    def _backward(self, *a, **k):
        before = rss()
        libc.malloc_trim(0)
        records.append({"t": round(time.monotonic() - t0, 2), "trim_gib": round((before - rss()) / 2**30, 3)})
        return _orig_backward(self, *a, **k)
    _eng.DeepSpeedEngine.backward = _backward
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
