import json, sys, collections
for arm in sys.argv[1:]:
    rec = json.load(open(f'/tmp/wp/{arm}.waits.json')); io = json.load(open(f'/tmp/wp/{arm}.waits.json.io'))
    sb = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'step' and r[3] == 'begin']
    se = [r[0] for r in rec if r[1] == 'engine' and r[2] == 'step' and r[3] == 'end']
    k = len(sb) - 2 if len(sb) > 3 else len(sb)-1
    u, e = sb[k], se[k]
    ev = []
    for s, t, w, n, p, th in io:
        s2, t2 = max(s, u), min(t, e)
        if t2 > s2:
            ev.append((s2, 1, w)); ev.append((t2, -1, w))
    ev.sort()
    cnt = {0: 0, 1: 0}; last = u; dist = collections.Counter()
    for t, d, w in ev:
        dist[(cnt[0], cnt[1])] += t - last; last = t
        cnt[w] += d
    dist[(cnt[0], cnt[1])] += e - last
    print(arm, f"update {e-u:.2f}s; seconds by (reads, writes) in flight:", {k: round(v, 2) for k, v in sorted(dist.items())})
    sizes = collections.Counter((w, n) for s, t, w, n, p, th in io if u <= s <= e)
    print("   requests (write, bytes): count", sorted(sizes.items())[:12])
    rr = [n / (t - s) / 1e9 for s, t, w, n, p, th in io if u <= s <= e and t > s]
    # per-sub-group timeline: the waits by the store
    waits = [r for r in rec if u <= r[0] <= e and r[3] in ('wait_read', 'lend_copied') and r[4] > 0.01]
    print("   waits >10ms:", len(waits), "total", round(sum(r[4] for r in waits), 2))
