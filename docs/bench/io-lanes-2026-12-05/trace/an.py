import json, collections, sys
rec=json.load(open(sys.argv[1]))
ends=[r[0] for r in rec if r[1]=='engine' and r[2]=='step' and r[3]=='end']
sb=[r[0] for r in rec if r[1]=='engine' and r[2]=='step' and r[3]=='begin']
bw=[r[0] for r in rec if r[1]=='engine' and r[2]=='backward']
for k in (-2,-1):
  t0,t1=ends[k-1],ends[k]
  b=[x for x in bw if t0<x<t1][0]; u=[x for x in sb if t0<x<t1][0]
  W=[r for r in rec if t0<=r[0]<=t1 and r[1]=='optimizer']
  wr=sum(r[4] for r in W if r[3] in('wait_read','lend_copied'))
  print(f"step {t1-t0:.2f}s fwd {b-t0:.2f} bwd {u-b:.2f} update {t1-u:.2f} optwait {wr:.2f}")
  groups=[]
  for r in W:
    if r[3]=='lend_copied': groups.append([round(r[0]-u,2),0.0])
    if r[3] in('wait_read',) and groups: groups[-1][1]+=r[4]
  print('  sub-group start (s into update), wait:', [(g[0],round(g[1],2)) for g in groups])
