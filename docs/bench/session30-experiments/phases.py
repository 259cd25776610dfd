import json, sys
keys = ["DeepSpeedEngine.backward", "DeepSpeedEngine.forward", "DeepSpeedZeroOptimizer_Stage3.step",
        "DeepSpeedZeroOptimizer_Stage3.partition_grads", "DeepSpeedZeroOptimizer_Stage3.independent_gradient_partition_epilogue",
        "DeepSpeedZeroOptimizer_Stage3._constant_buffered_norm2", "EntryStore.wait_read", "DeepSpeedZeroOptimizer_Stage3._optimizer_step"]
print("run".ljust(28) + "step    " + " ".join(k.split(".")[-1][:14].rjust(14) for k in keys))
for f in sys.argv[1:]:
    d = json.load(open(f))
    ph = d["phases"]
    print(f.split("/")[-1].ljust(28) + f"{d['wall_ms_per_step']/1000:6.2f}  " + " ".join(f"{ph.get(k,{}).get('ms_per_step',0)/1000:14.2f}" for k in keys))
