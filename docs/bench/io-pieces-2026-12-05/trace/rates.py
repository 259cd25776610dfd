import json, sys, collections
for arm in sys.argv[1:]:
    rec = json.load(open(f'/tmp/wp/{arm}.waits.json')); io = json.load(open(f'/tmp/wp/{arm}.waits.json.io'))
    sb = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'step' and r[3] == 'begin']
    se = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'step' and r[3] == 'end']
    tot_t = collections.Counter(); tot_b = collections.Counter()
    for k in range(3, len(sb)):
        u, e = sb[k], se[k]
        reqs = [(max(s, u), min(t, e), w, n / (t - s)) for s, t, w, n, p, th in io if min(t, e) > max(s, u) and t > s]
        pts = sorted({u, e} | {x for r in reqs for x in r[:2]})
        for a, b in zip(pts, pts[1:]):
            mid = (a + b) / 2
            act = [r for r in reqs if r[0] <= mid < r[1]]
            key = (sum(1 for r in act if not r[2]), sum(1 for r in act if r[2]))
            tot_t[key] += b - a
            tot_b[key] += sum(r[3] for r in act) * (b - a)
    print(arm, {k: f"{tot_t[k]:.2f}s {tot_b[k]/max(tot_t[k],1e-9)/1e9:.2f}GB/s" for k in sorted(tot_t)})
