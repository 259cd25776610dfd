"""Re-price a `validate_estimate.py --profile-runs` folder with the code in the tree (not prospective), from its
calibrated machine files and, by default, its profiles (as the run priced it); `calib`: from the calibration alone.
"was": what the run predicted. python3 reprice.py FOLDER [profiled|calib]"""
import sys, os, json
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts")); sys.path.insert(0, REPO)
import validate_estimate as V
from tencache_ds.plan.machine import load_machine
from tencache_ds.plan.model_shapes import model_shape
from tencache_ds.plan.profile_timings import machine_from_profile
from tencache_ds.plan.workload import ZeroSettings, build_workload
from tencache_ds.profile.store import read_sections
folder = sys.argv[1]; mode = sys.argv[2] if len(sys.argv) > 2 else "profiled"
rows = []; within = 0
preds = json.load(open(os.path.join(folder, "predictions.json")))["predictions"]
for name, p in preds.items():
    model, budget = p["model"], p["budget"]
    mfile = os.path.join(folder, f"machine-{model}.json")
    machine = load_machine(mfile if os.path.exists(mfile) else os.path.join(folder, "machine.json"))
    cfg = V.CONFIG_FOR.get(model, V.DEFAULT_CONFIG)
    bench = V.measured_from_bench(os.path.join(folder, name))
    s = bench["settings"]; mb, seq = s.get("micro_batch", 2), s.get("seq_len", 64)
    if mode == "profiled":
        block = {"enabled": True, "host_cache_bytes": "auto", "device_cache_bytes": 0}
        ds = dict(V.with_dtype(V.read_json(os.path.join(V.REPO, cfg)), "fp32"), tencache=block)
        shape = model_shape(V.read_json(os.path.join(V.REPO, "configs", "models", f"{model}.json")))
        work = build_workload(shape, ZeroSettings.from_ds_config(ds), machine.world_size, mb, seq,
                              int(ds.get("gradient_accumulation_steps", 1)), False)
        machine, _ = machine_from_profile(machine, work, read_sections(os.path.join(folder, f"profile-{model}.json")), "p")
    got = V.predict_configuration(machine, model, cfg, p["host_cache_bytes"], mb, seq, False, dtype="fp32")
    for arm in ("stock", "tencache"):
        meas = bench["arms"][arm]["step_time_s"]; pr = got[arm]["step_time_s"]; err = pr / meas - 1
        within += abs(err) <= 0.15
        print(f"{name:22s} {arm:9s} {pr:7.3f} / {meas:7.3f}  {err:+.0%}   (was {p['predicted'][arm]['step_time_s']:.3f})")
print("within 15%:", within, "of", 2 * len(preds))
