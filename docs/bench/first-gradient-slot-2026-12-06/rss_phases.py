import sys
P=[]; M=[]
for line in open(sys.argv[1]):
    f=line.split()
    if f[0]=="P" and f[1] in ("forward","backward","step"):
        P.append((f[1], float(f[-2]), float(f[-1])))
    elif f[0]=="M": M.append((float(f[1]), int(f[2])))
G=2**30
steps=[p for p in P if p[0]=="step"]; fw=[p for p in P if p[0]=="forward"]; bw=[p for p in P if p[0]=="backward"]
for i,(s,f,b) in enumerate(zip(steps,fw,bw)):
    def mx(t0,t1):
        v=[r for t,r in M if t0<=t<t1]; return (max(v)/G if v else 0, min(v)/G if v else 0)
    print(f"step {i}: fwd {f[2]-f[1]:.1f}s max/min {mx(f[1],f[2])[0]:.2f}/{mx(f[1],f[2])[1]:.2f}  bwd {b[2]-b[1]:.1f}s {mx(b[1],b[2])[0]:.2f}/{mx(b[1],b[2])[1]:.2f}  upd {s[2]-s[1]:.1f}s {mx(s[1],s[2])[0]:.2f}/{mx(s[1],s[2])[1]:.2f}")
print("overall max", max(r for t,r in M)/G)
