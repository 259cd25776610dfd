"""Time and bytes of engine.save_checkpoint, stock DeepSpeed against tencache, with the optimizer on NVMe. Trains
WARMUP steps, then saves twice with one step between (the first save, and one in steady state; SAVES below), and
prints a RESULT
line: for each save its wall time, the time until the checkpoint is on disk (os.sync), the bytes this process wrote
(/proc/self/io write_bytes: O_DIRECT and buffered), the bytes the checkpoint holds (each inode once; blocks a file
shares with another by reflink are counted in both), and under tencache the bytes each swapper wrote during the save
(the flush of what the host tier owes its files; of it, the fp32 masters owed to their files, and how many were
owed before the save) and, where the ZeRO file took its masters from the swap files (torch's own checkpoint engine),
its bytes shared with them (a file system that clones), copied from them, and written from memory, and its time.

    python tests/deepspeed/measure_checkpoint_save.py stock|tencache MODEL NVME_DIR CKPT_DIR [HOST_CACHE_BYTES|auto]
        [SUB_GROUP_SIZE|-] [DS_CONFIG]

DS_CONFIG defaults to configs/stock-nvme.json (the beyond-RAM model: configs/stock-nvme-beyond-ram.json).

The numbers in docs/benchmarks.md come from it (gpt2-small, fp32, parameters and optimizer on NVMe).
"""
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402
import deepspeed  # noqa: E402

# steps before the first save (CHECKPOINT_SAVE_WARMUP; 3 or more for a first save under tencache with fp32 masters
# owed to their files, which starts at the third step where the host tier holds the partitions, gpt2-1.3b's
# [0, 0, 13], and at the first where they stream, gpt2-2.7b's [25, 25, 25]: master_write_behind.py)
WARMUP = int(os.environ.get("CHECKPOINT_SAVE_WARMUP", "2"))
# saves, and whether a step follows the last (CHECKPOINT_SAVES=1 CHECKPOINT_STEP_AFTER_LAST=0 on a disk that holds
# the swap folder and one checkpoint but not the files a step rewrites beside the checkpoint's: gpt2-2.7b here)
SAVES = int(os.environ.get("CHECKPOINT_SAVES", "2"))
STEP_AFTER_LAST = os.environ.get("CHECKPOINT_STEP_AFTER_LAST", "1") != "0"


def written_bytes():
    counts = train.read_proc_io()
    if counts is None:  # what the save wrote is this measurement's point: no figure rather than a false 0
        raise SystemExit("measure_checkpoint_save.py: /proc/self/io is unreadable here; the bytes a save writes "
                         "cannot be measured")
    return counts["write_bytes"]


def checkpoint_bytes(folder):
    """Bytes of the checkpoint's files, each inode counted once (a linked file is not a second copy on disk)."""
    seen, total = set(), 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            status = os.stat(os.path.join(root, name))
            if (status.st_dev, status.st_ino) not in seen:
                seen.add((status.st_dev, status.st_ino))
                total += status.st_blocks * 512
    return total


def main(mode, model, nvme, checkpoint, host_cache_bytes="auto", sub_group_size=None,
         ds_config=os.path.join(REPO, "configs", "stock-nvme.json")):
    sub_group_size = None if sub_group_size == "-" else sub_group_size
    block = "none" if mode == "stock" else json.dumps(
        {} if host_cache_bytes == "auto" else {"host_cache_bytes": int(float(host_cache_bytes))})
    args = train.parse_args(["--deepspeed_config", ds_config, "--model", model,
                             "--nvme-path", nvme, "--tencache-block", block, "--dtype", "fp32"]
                            + ([] if sub_group_size is None else ["--sub-group-size", sub_group_size]))
    if mode == "tencache":
        train.import_plugin()  # train.py imports tencache_ds only when asked: without it the block is ignored
    train.ensure_dist_env()
    deepspeed.init_distributed()
    cfg = train.load_ds_config(args.ds_config_path, args)
    _, model_cfg = train.load_model_config(model)
    train.seed_everything(1234)
    module, _keepalive = train.build_model("zero", model_cfg, cfg)
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=cfg)
    stream = train.synthetic_batches(model_cfg.vocab_size, cfg["train_micro_batch_size_per_gpu"], 64, 1234)
    owed = []  # tencache: fp32 masters owed to their files after each warm-up step
    for _ in range(WARMUP):
        train.train_step(engine, stream, 1)
        owed.append((train.plugin_stats(engine) or {}).get("optimizer_masters_owed"))
    saves = []
    for number in range(SAVES):
        tag = f"save{number}"
        os.sync()
        stats_before = train.plugin_stats(engine) or {}
        before, started = written_bytes(), time.perf_counter()
        engine.save_checkpoint(checkpoint, tag=tag)
        saved = time.perf_counter()
        os.sync()
        synced = time.perf_counter()
        saves.append({"tag": tag, "save_s": round(saved - started, 3), "save_and_sync_s": round(synced - started, 3),
                      "written_bytes": written_bytes() - before,
                      "checkpoint_bytes": checkpoint_bytes(os.path.join(checkpoint, tag))})
        stats_after = train.plugin_stats(engine) or {}
        for key in ("optimizer_nvme_write_bytes", "param_nvme_write_bytes",  # tencache's flush, by swapper
                    "optimizer_master_bytes_written_behind"):  # ... of it, masters owed to their files
            if key in stats_after:
                saves[-1][key] = stats_after[key] - stats_before.get(key, 0)
        if "optimizer_masters_owed" in stats_before:  # masters whose files were behind their partitions
            saves[-1]["optimizer_masters_owed_before"] = stats_before["optimizer_masters_owed"]
        zero_file = getattr(getattr(engine.optimizer, "optimizer_swapper", None), "last_zero_file_save", None)
        if zero_file is not None:  # the ZeRO file's masters taken from the swap files (io/save_from_files.py)
            saves[-1]["zero_file_shared_bytes"] = zero_file.cloned_bytes
            saves[-1]["zero_file_copied_bytes"] = zero_file.copied_bytes
            saves[-1]["zero_file_written_bytes"] = zero_file.written_bytes
            saves[-1]["zero_file_written_with_master_settle_bytes"] = getattr(zero_file, "filled_when_written_bytes", 0)
            saves[-1]["zero_file_s"] = round(zero_file.seconds, 3)
        if number + 1 < SAVES or STEP_AFTER_LAST:
            train.train_step(engine, stream, 1)
    if mode == "tencache" and not train.plugin_stats(engine):
        raise SystemExit("tencache mode, but the engine runs stock DeepSpeed's swappers")
    print("RESULT " + json.dumps({"mode": mode, "model": model, "host_cache_bytes": host_cache_bytes,
                                  "sub_group_size": sub_group_size,
                                  "params": train.count_params(engine.module), "warmup_masters_owed": owed,
                                  "saves": saves}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:8])
