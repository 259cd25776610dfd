"""Per step: forward, backward, update seconds; drive bytes and busy (union of requests in flight) in each."""
import json, sys
for arm in sys.argv[1:]:
    rec = json.load(open(f'/tmp/wp/{arm}.waits.json')); io = json.load(open(f'/tmp/wp/{arm}.waits.json.io'))
    sb = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'step' and r[3] == 'begin']
    se = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'step' and r[3] == 'end']
    bw = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'backward']
    def window(a, z):
        rb = wb = 0.0; iv = []
        for s, t, w, n, p, th in io:
            ov = max(0, min(t, z) - max(s, a))
            if t > s and ov > 0:
                if w: wb += n * ov / (t - s)
                else: rb += n * ov / (t - s)
                iv.append((max(s, a), min(t, z)))
        iv.sort(); busy = 0; cur = None
        for s, t in iv:
            if cur is None or s > cur[1]:
                if cur: busy += cur[1] - cur[0]
                cur = [s, t]
            else: cur[1] = max(cur[1], t)
        if cur: busy += cur[1] - cur[0]
        return rb / 1e9, wb / 1e9, busy
    for k in range(1, len(sb)):
        f = se[k - 1]; u, e = sb[k], se[k]; b = [x for x in bw if x < u][-1]
        out = []
        for name, (a, z) in (('fwd', (f, b)), ('bwd', (b, u)), ('upd', (u, e))):
            r, w, busy = window(a, z)
            out.append(f"{name} {z-a:5.2f}s r{r:5.2f} w{w:5.2f} busy{busy:5.2f}")
        print(f"{arm} step{k} " + " | ".join(out))
