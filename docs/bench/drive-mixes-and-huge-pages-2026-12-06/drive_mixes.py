"""Mixes of reads and writes through tencache's engine (io/direct_io.py) into arena slots, against taking turns
(reads alone, then writes alone) at the rates measured alone: is the drive's rate region the convex hull of the
probe's three modes? Run from the repository root: python docs/bench/drive-mixes-and-huge-pages-2026-12-06/drive_mixes.py
(2 x 2 GiB of files under /tmp/dp/f; output: drive_mixes.txt)."""
import os, time
from tencache_ds.io.drive_rate import trial_buffers, _trial, ARENA_BUFFERS, BOTH, READ, WRITE, trial_file
from tencache_ds.io.direct_io import DirectFileIO
folder="/tmp/dp/f"; os.makedirs(folder, exist_ok=True)
RB=64<<20; N=32  # 2 GiB per file
a, b = trial_file(folder,"a"), trial_file(folder,"b")
for threads in (2, 4):
  with trial_buffers(ARENA_BUFFERS, RB, threads) as bufs:
    io = DirectFileIO(num_threads=threads, name="mix")
    for p in (a, b):
        _trial(io, WRITE, bufs, [(p, i) for i in range(N)], RB, 30, ARENA_BUFFERS)
    res = {}
    for rep in range(2):
        r = _trial(io, READ, bufs, [(a, i) for i in range(N)], RB, 30, ARENA_BUFFERS); res.setdefault("r",[]).append(r.read_bytes_per_s)
        w = _trial(io, WRITE, bufs, [(b, i) for i in range(N)], RB, 30, ARENA_BUFFERS); res.setdefault("w",[]).append(w.write_bytes_per_s)
    rr, ww = max(res["r"]), max(res["w"])
    print(f"threads {threads}: read alone {rr/1e9:.2f} write alone {ww/1e9:.2f}")
    for nr, nw in ((1,3),(1,2),(1,1),(2,1),(3,1)):
        best=None
        for rep in range(2):
            pat=[]; ir=iw=0
            while ir < N and iw < N:
                for _ in range(nr):
                    if ir<N: pat.append((a, ir)); ir+=1
                for _ in range(nw):
                    if iw<N: pat.append((b, iw)); iw+=1
            t=_trial(io, BOTH, bufs, pat, RB, 30, ARENA_BUFFERS)
            ts = t.read_bytes/rr + t.write_bytes/ww  # time-sharing time for the same bytes
            cand=(t.seconds, t.read_bytes_per_s, t.write_bytes_per_s, ts)
            if best is None or cand[0]/cand[3] < best[0]/best[3]: best=cand
        s, R, W, ts = best
        print(f"  mix {nr}R:{nw}W  read {R/1e9:.2f} write {W/1e9:.2f} total {(R+W)/1e9:.2f} GB/s; took {s:.2f}s vs time-sharing {ts:.2f}s ratio {s/ts:.2f}")
    io.close()
for p in (a,b): os.remove(p)
