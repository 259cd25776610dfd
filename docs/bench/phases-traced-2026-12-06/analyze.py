"""Per step of a trace (wrap.py): phases, the update's sub-groups (swap-in wait, Adam, swap-out), and the drive's
bytes and busy time by phase."""
import sys, collections, gzip
P = []; IO = []
for line in (gzip.open(sys.argv[1], "rt") if sys.argv[1].endswith(".gz") else open(sys.argv[1])):
    f = line.split()
    if f[0] == "P":
        if len(f) == 5: P.append((f[1], f[2], float(f[3]), float(f[4])))
        else: P.append((f[1], "", float(f[2]), float(f[3])))
    elif f[0] == "IO":
        IO.append((f[1], f[2], int(f[3]), f[4], float(f[5]), float(f[6])))
def union(iv):
    iv = sorted(iv); tot = 0; cur = None
    for b, e in iv:
        if cur is None or b > cur[1]:
            if cur: tot += cur[1] - cur[0]
            cur = [b, e]
        else: cur[1] = max(cur[1], e)
    if cur: tot += cur[1] - cur[0]
    return tot
phases = [p for p in P if p[0] in ("forward", "backward", "step")]
steps = [p for p in phases if p[0] == "step"]
fwd = [p for p in phases if p[0] == "forward"]
only = set(sys.argv[2:]) if len(sys.argv) > 2 else None
for i, st in enumerate(steps):
    if only and str(i) not in only: continue
    f, b = fwd[i], [p for p in phases if p[0] == "backward"][i]
    print(f"== step {i}: forward {f[3]-f[2]:.2f} backward {b[3]-b[2]:.2f} update {st[3]-st[2]:.2f}  (t {f[2]:.1f}-{st[3]:.1f})")
    for name, (t0, t1) in (("forward", (f[2], f[3])), ("backward", (b[2], b[3])), ("update", (st[2], st[3]))):
        ios = [x for x in IO if t0 <= x[4] < t1]
        r = sum(x[2] for x in ios if x[1] == "R"); w = sum(x[2] for x in ios if x[1] == "W")
        busy = union([(max(x[4], t0), min(x[5], t1)) for x in IO if x[5] > t0 and x[4] < t1])
        print(f"   {name}: read {r/1e9:.2f} GB written {w/1e9:.2f} GB started here; drive busy {busy:.2f} s of {t1-t0:.2f}")
    sub = [p for p in P if p[0] in ("swapin", "adam", "swapout") and st[2] <= p[2] <= st[3]]
    rows = collections.OrderedDict()
    for tag, label, t0_, t1_ in sub:
        rows.setdefault(label, {})[tag] = (t0_ - st[2], t1_ - t0_)
    line = []
    for label, d in rows.items():
        line.append(f"{label}: in {d.get('swapin',(0,0))[1]:.2f} adam {d.get('adam',(0,0))[1]:.2f} out {d.get('swapout',(0,0))[1]:.2f}")
    print("   ", " | ".join(line))
    waits = [p for p in P if p[0] == "wait" and st[2] <= p[2] <= st[3] and p[3] - p[2] > 0.01]
    print("    waits in update >10ms:", [(p[1][-30:], round(p[2]-st[2], 2), round(p[3]-p[2], 2)) for p in waits])
    waits = [p for p in P if p[0] == "wait" and f[2] <= p[2] < st[2] and p[3] - p[2] > 0.01]
    print("    waits before update >10ms:", [(p[1][-30:], round(p[3]-p[2], 2)) for p in waits][:10])
