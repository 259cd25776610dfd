"""For one step's forward pass of a trace (../phases-traced-2026-12-06/wrap.py): each parameter file's request as
submitted (W: a write, R: a read), its first and last 64 MiB piece on the drive, and the wait for that partition at
its use (start, length), in seconds from the forward's start. Before the change every read is submitted at its use,
right after the write of the partition it evicts: `python reads_at_use.py old-1.trace.gz 3`."""
import gzip, sys
path, step = sys.argv[1], int(sys.argv[2])
P, IO, SUB = [], [], []
for line in gzip.open(path, "rt"):
    f = line.split()
    if f[0] == "P":
        P.append((f[1], f[2] if len(f) == 5 else "", float(f[-2]), float(f[-1])))
    elif f[0] == "IO":
        IO.append((f[2], f[4], float(f[5]), float(f[6])))
    elif f[0] == "SUB":
        SUB.append((f[1], f[2], float(f[3])))
forward = [p for p in P if p[0] == "forward"][step]
t0, t1 = forward[2], forward[3]
waits = {p[1]: p for p in P if p[0] == "wait" and t0 <= p[2] < t1}
for kind, name, at in [s for s in SUB if t0 - 1 <= s[2] < t1 and "param" in s[1]][:40]:
    key = name.split("_")[0]
    pieces = [x for x in IO if x[1] == name and at - 0.001 <= x[2] < at + 5]
    wait = waits.get(key)
    print(kind, key, round(at - t0, 3), round(min(x[2] for x in pieces) - t0, 3) if pieces else None,
          round(max(x[3] for x in pieces) - t0, 3) if pieces else None,
          (round(wait[2] - t0, 3), round(wait[3] - wait[2], 3)) if wait else None)
