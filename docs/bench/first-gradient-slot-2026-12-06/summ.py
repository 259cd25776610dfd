import sys, statistics
for fn in sys.argv[1:]:
    P=[]; M=[]; A=[]; W=[]
    for line in open(fn):
        f=line.split()
        if f[0]=="P":
            P.append((f[1], f[2] if len(f)==5 else "", float(f[-2]), float(f[-1])))
        elif f[0]=="M": M.append((float(f[1]), int(f[2])))
        elif f[0] in ("ALLOC","RESTORE"): A.append((f[0], float(f[3] if f[0]=="ALLOC" else f[3])))
    steps=[p for p in P if p[0]=="step"]; fw=[p for p in P if p[0]=="forward"]; bw=[p for p in P if p[0]=="backward"]
    rows=[]
    for i,(s,f,b) in enumerate(zip(steps,fw,bw)):
        sw0=[p for p in P if p[0]=="swapin" and p[1]=="0" and s[2]<=p[2]<=s[3]]
        waits=sum(p[3]-p[2] for p in P if p[0]=="wait" and s[2]<=p[2]<=s[3])
        allocs=sum(1 for k,t in A if s[2]<=t<=s[3])
        bwr=[r for t,r in M if b[2]<=t<b[3]]
        rows.append((i, s[3]-f[2], f[3]-f[2], b[3]-b[2], s[3]-s[2], sw0[0][3]-sw0[0][2] if sw0 else -1, waits, allocs, max(bwr)/2**30 if bwr else 0))
    print(fn)
    for r in rows: print("  step %d: total %.2f fwd %.2f bwd %.2f upd %.2f swapin0 %.2f waits %.2f allocs %d bwdRSS %.2f" % r)
    last=[r for r in rows if r[0]>=3]
    if last: print("  median steps>=3: total %.2f upd %.2f swapin0 %.2f waits %.2f" % tuple(statistics.median(r[k] for r in last) for k in (1,4,5,6)))
