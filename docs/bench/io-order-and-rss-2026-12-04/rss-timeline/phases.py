import sys
for path in sys.argv[1:]:
    samples=[]; marks=[]
    for line in open(path):
        p=line.split()
        if p[0]=="S": samples.append((float(p[1]),int(p[2]),int(p[3])))
        else: marks.append((p[0],float(p[1]),p[2]))
    # phases: between B and E of each
    opens={}
    phases=[]
    for k,t,n in marks:
        if k=="B": opens[n]=t
        else: phases.append((opens.pop(n),t,n))
    phases.sort()
    print(path)
    G=2**30
    for i,(a,b,n) in enumerate(phases):
        s=[x for x in samples if a<=x[0]<=b]
        if not s: continue
        mx=max(s,key=lambda x:x[1]); 
        print(f"{n:9s} {a:8.1f}-{b:8.1f} ({b-a:5.1f}s) rss start {s[0][1]/G:6.2f} max {mx[1]/G:6.2f} at +{mx[0]-a:5.1f}s end {s[-1][1]/G:6.2f}  anon max {max(x[2] for x in s)/G:6.2f}")
    print("overall peak", max(x[1] for x in samples)/G)
