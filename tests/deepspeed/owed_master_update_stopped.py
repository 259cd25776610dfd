"""An update that stops after its fp32 master was filled from the parameter partitions it was owed from
(integrations/deepspeed/master_write_behind.py: the master's file is behind them, the debt went with the lent
master), then a checkpoint save: refused with an error that says why before any of its files is written, never a
checkpoint that links the stale master file. The update stops on the moments' files moved away (put back before
the save). With ``read-ahead``, the update stops instead on an error from the read ahead of the next sub-group,
which a swap-in starts after its master was lent (until 2026-12-06 outside what records it as lent: the debt
was then recorded nowhere and the save linked the stale file). gpt2-tiny in fp32 with every parameter partition
held and the optimizer state streamed (as in test_master_copies.py), one rank, DeepSpeed's CPU accelerator; prints
OK or raises.
``python owed_master_update_stopped.py PORT [read-ahead]``"""
import glob
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import train  # noqa: E402  (scripts/train.py)

train.import_plugin()
import deepspeed  # noqa: E402

from tencache_ds.errors import StaleFileError  # noqa: E402

with tempfile.TemporaryDirectory() as nvme, tempfile.TemporaryDirectory() as checkpoints:
    args = train.parse_args(["--deepspeed_config", os.path.join(REPO, "configs", "stock-nvme.json"),
                             "--model", "gpt2-tiny", "--nvme-path", nvme, "--dtype", "fp32",
                             "--sub-group-size", "2000000",
                             "--tencache-block", json.dumps({"host_cache_bytes": "100MB"})])
    train.ensure_dist_env()
    deepspeed.init_distributed()
    cfg = train.load_ds_config(args.ds_config_path, args)
    _, model_cfg = train.load_model_config("gpt2-tiny")
    train.seed_everything(1234)
    module, _keepalive = train.build_model("zero", model_cfg, cfg)
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=cfg)
    stream = train.synthetic_batches(model_cfg.vocab_size, cfg["train_micro_batch_size_per_gpu"], 64, 1234)
    for _ in range(3):
        train.train_step(engine, stream, 1)
    stats = train.plugin_stats(engine)
    assert stats["optimizer_masters_owed"] > 0, stats["optimizer_masters_owed"]
    swapper = engine.optimizer.optimizer_swapper
    if sys.argv[2:] == ["read-ahead"]:
        def refused(*_args, **_kwargs):
            raise OSError("the read ahead of the next sub-group was refused")
        swapper.ahead.next_sub_group_if_free = refused
        try:
            train.train_step(engine, stream, 1)
            raise AssertionError("the update went on past its refused read ahead")
        except OSError as err:
            assert "read ahead" in str(err), err
        del swapper.ahead.next_sub_group_if_free
    else:
        moved = glob.glob(os.path.join(nvme, "zero_stage_3", "optimizer", "rank0", "exp_avg*.swp"))
        for path in moved:
            shutil.move(path, path + ".away")
        try:
            train.train_step(engine, stream, 1)
            raise AssertionError("the update went on without its moments' files")
        except StaleFileError:
            pass
        for path in moved:
            shutil.move(path + ".away", path)
    try:
        engine.save_checkpoint(checkpoints, tag="stopped")
        raise AssertionError("saved with a master's file behind its lent master")
    except RuntimeError as err:
        assert "masters' files behind them" in str(err), err
    assert not os.path.exists(os.path.join(checkpoints, "stopped")), os.listdir(checkpoints)  # refused at its start
    try:
        engine.destroy()
    except StaleFileError:  # the reads ahead of the moved files: the error the run stopped on, again
        pass
    # ... raised once the swapper had given everything back: no I/O thread of its outlives it (until 2026-11-30 the
    # first error skipped the rest of close)
    assert swapper.closed and swapper.io._pool._shutdown, "the swapper's I/O threads outlived its close"
print("OK")
