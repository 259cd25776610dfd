import json, glob, os, statistics
for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), '*.metrics.jsonl'))):
    rows = [json.loads(l) for l in open(f)]
    late = [r for r in rows if r['step'] >= 3]
    res = json.load(open(f.replace('.metrics.jsonl', '.result.json'))) if os.path.exists(f.replace('.metrics.jsonl', '.result.json')) else {}
    steps = res.get('steps', [])
    ra = [s['stats'].get('optimizer_backward_reads_ahead') for s in steps]
    print(os.path.basename(f).split('.')[0],
          'step', [round(r['step_time_s'], 1) for r in late], 'median %.2f' % statistics.median(r['step_time_s'] for r in late),
          'optwait', [round(r['optimizer_nvme_wait_s'], 1) for r in late],
          'paramwait', [round(r['param_nvme_wait_s'], 1) for r in late],
          'busy', [round(r['nvme_busy_fraction'], 2) for r in late],
          'rd GiB', [round(r['nvme_read_bytes'] / 2**30, 1) for r in late],
          'budget', round(late[-1]['host_cache_budget_bytes'] / 2**30, 2), 'ra', ra, 'sha', (res.get('weights_sha256') or '')[:8],
          'peak', round(max(s['peak_rss_bytes'] for s in steps) / 2**30, 2) if steps else None)
