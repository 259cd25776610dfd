"""Sample VmRSS/RssAnon/RssShmem of every scripts/train.py process every 0.5 s until none is left (after one was seen)."""
import os, sys, time, json
out = open(sys.argv[1], 'w'); seen = False; t0 = time.time()
while True:
    rows = {}
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            cmd = open(f'/proc/{pid}/cmdline').read()
            if 'train.py' not in cmd or 'launcher' in cmd or 'in_memory_cgroup' in cmd: continue
            st = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status'))
            rank = cmd.split('--local_rank=')[1].split('\0')[0] if '--local_rank=' in cmd else '?'
            rows[rank] = [int(st[k].split()[0]) >> 10 for k in ('VmRSS', 'RssAnon', 'RssShmem')]
        except Exception: pass
    mem = dict(l.split(':', 1) for l in open('/proc/meminfo'))
    avail = int(mem['MemAvailable'].split()[0]) >> 10
    if rows: seen = True
    elif seen: break
    out.write(json.dumps([round(time.time() - t0, 1), time.time(), avail, rows]) + '\n'); out.flush()
    time.sleep(0.5)
