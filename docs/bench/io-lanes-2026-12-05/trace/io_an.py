import json, sys
for arm in sys.argv[1:]:
    rec=json.load(open(f'{arm}.waits.json')); io=json.load(open(f'{arm}.waits.json.io'))
    sb=[r[0] for r in rec if r[1]=='engine' and r[2]=='step' and r[3]=='begin']
    se=[r[0] for r in rec if r[1]=='engine' and r[2]=='step' and r[3]=='end']
    bw=[r[0] for r in rec if r[1]=='engine' and r[2]=='backward']
    u,e=sb[-1],se[-1]; b=[x for x in bw if x<u][-1]; f=se[-2]
    def window(a,z):
        rb=wb=0.0; busy=0.0
        for s,t,w,n,p,th in io:
            ov=max(0,min(t,z)-max(s,a))
            if t>s and ov>0:
                frac=ov/(t-s)
                if w: wb+=n*frac
                else: rb+=n*frac
                busy+=ov
        return rb/1e9, wb/1e9, busy
    for name,(a,z) in (('fwd',(f,b)),('bwd',(b,u)),('update',(u,e)),('after',(e,e+3))):
        r,w,busy=window(a,z)
        print(f"{arm:7s} {name:7s} {z-a:5.2f}s read {r:5.2f} GB write {w:5.2f} GB  thread-busy {busy:5.2f}s  rate {(r+w)/max(1e-9,z-a):4.2f} GB/s")
    # per-request service rates in update
    rr=[n/(t-s)/1e9 for s,t,w,n,p,th in io if u<=s<=e and not w and n>1e8]
    ww=[n/(t-s)/1e9 for s,t,w,n,p,th in io if u<=s<=e and w and n>1e8]
    import statistics as st
    print(f"   per-request GB/s in update: reads n={len(rr)} median {st.median(rr) if rr else 0:.2f}, writes n={len(ww)} median {st.median(ww) if ww else 0:.2f}")
