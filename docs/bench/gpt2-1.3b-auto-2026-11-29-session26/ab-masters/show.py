import json,sys
for f in sys.argv[1:]:
    r=json.load(open(f))
    steps=r['steps']
    print(f, [round(s.get('time_s',0),2) for s in steps], r['weights_sha256'][:12])
    for s in steps:
        st=s.get('stats') or {}
        print('  ', {k.replace('optimizer_',''):(round(st[k]/2**30,2) if 'bytes' in k else st[k]) for k in st if 'from_partitions' in k or k in ('optimizer_nvme_read_bytes','optimizer_nvme_write_bytes','fetch_wait_s','host_pressure_shrinks','optimizer_cache_budget_bytes','param_nvme_read_bytes')})
