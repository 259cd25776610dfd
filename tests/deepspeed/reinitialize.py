"""The same model under a new engine after ``engine.destroy()``: Hugging Face Accelerate's ``free_memory()`` destroys
the engine before the same model is prepared again (a second ``trainer.train()``, ``auto_find_batch_size``, trainers
that swap optimizers). Train two steps, destroy (twice: stock tolerates it), ``deepspeed.initialize`` the same
zero.Init model, train two more. Prints one RESULT line: the losses, and tencache's swapper states.

    python tests/deepspeed/reinitialize.py stock|tencache NVME_DIR [refused-model-between|stock-model-alongside|
                                                                    failed-initialize-first|failed-build-after,...]

``refused-model-between`` (tencache): after the first destroy, a second zero.Init model in the same folder is
refused before it empties the folder (a stale build lock of DeepSpeed's async_io op, left by a killed build, in a
TORCH_EXTENSIONS_DIR of its own: the swapper's constructor checks for one first); the lock removed, the first model
gets its new engine and trains on with its own files. The error is in the RESULT line.
``stock-model-alongside`` (tencache): before the first engine, while the first model's swapper is live, a second
zero.Init model in the same folder under a config without the "tencache" block is refused (DeepSpeed's own swapper
would delete the folder's files: helper-207); the first model trains on with its own files.
``failed-build-after`` (tencache): after the last destroy, a ``deepspeed.initialize`` of the model whose ZeRO-3
optimizer fails to build (its swap files cannot be written: a file size limit); the RESULT line holds the parameter
swapper's state after it (resting, users). (Stock leaves that engine's hooks on the model, which trains no more.)
``failed-initialize-first``: before the model, another zero.Init model whose ``deepspeed.initialize`` raises once its
ZeRO-3 optimizer is built (a client scheduler that raises), as a sweep meets one; the RESULT line holds the threads
that call left alive.
"""
import contextlib
import json
import os
import resource
import sys
import tempfile
import threading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402
import deepspeed  # noqa: E402
from rebuild import config  # noqa: E402


@contextlib.contextmanager
def stale_async_io_lock():
    """A stale build lock of the async_io op under a TORCH_EXTENSIONS_DIR of its own (the ops this process loaded
    stay loaded), removed afterwards."""
    before = os.environ.get("TORCH_EXTENSIONS_DIR")
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "async_io"))
        open(os.path.join(root, "async_io", "lock"), "w").close()
        os.environ["TORCH_EXTENSIONS_DIR"] = root
        try:
            yield
        finally:
            if before is None:
                del os.environ["TORCH_EXTENSIONS_DIR"]
            else:
                os.environ["TORCH_EXTENSIONS_DIR"] = before


def refused_model(cfg, model_cfg):
    """A second zero.Init model in the folder, refused before it empties it: its error."""
    with stale_async_io_lock():
        try:
            train.build_model("zero", model_cfg, json.loads(json.dumps(cfg)))
        except Exception as err:  # noqa: BLE001  (reported)
            return f"{type(err).__name__}: {err}"
    return None


def stock_model(cfg, model_cfg):
    """A second zero.Init model in the folder under a config without the "tencache" block: its error."""
    stock_cfg = json.loads(json.dumps(cfg))
    del stock_cfg["tencache"]
    try:
        train.build_model("zero", model_cfg, stock_cfg)
    except Exception as err:  # noqa: BLE001  (reported)
        return f"{type(err).__name__}: {err}"
    return None


class SchedulerFailed(Exception):
    pass


def failing_scheduler(_optimizer):
    """A client scheduler that raises: DeepSpeed calls it once the optimizer is built."""
    raise SchedulerFailed("the scheduler's own error")


def failed_initialize(cfg, model_cfg):
    """A zero.Init model whose ``deepspeed.initialize`` raises once its ZeRO-3 optimizer is built (stock leaves the
    engine's hooks on that model: it trains no more, and the run goes on with a new one). The threads the failed call
    left alive."""
    model, _ = train.build_model("zero", model_cfg, json.loads(json.dumps(cfg)))
    before = {thread.ident for thread in threading.enumerate()}
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=json.loads(json.dumps(cfg)),
                             lr_scheduler=failing_scheduler)
    except SchedulerFailed:
        return sorted(thread.name for thread in threading.enumerate() if thread.ident not in before)
    raise AssertionError("the scheduler did not raise")


def failed_build(model, cfg):
    """``deepspeed.initialize`` of ``model`` under a file size limit its optimizer swapper's first writes exceed
    (its error is TencacheResourceError, "File too large"): the model's parameter swappers' (resting, users)."""
    import tencache_ds
    from tencache_ds.integrations.deepspeed import reporting
    streaming = json.loads(json.dumps(cfg))
    streaming["tencache"]["host_cache_bytes"] = 0  # the optimizer's state written at start-up, not held
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limits[1]))  # (Python ignores SIGXFSZ: EFBIG instead)
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=streaming)
    except tencache_ds.TencacheResourceError as err:
        assert "File too large" in str(err), err
    else:
        raise AssertionError("the build did not fail")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    return [[swapper.resting, swapper._users] for swapper in reporting.param_swappers_of_module(model)]


def main(mode, nvme, between=None):
    between = set((between or "").split(","))
    train.ensure_dist_env()
    deepspeed.init_distributed()
    if mode != "stock":
        import tencache_ds
    cfg = config(mode, nvme, "nvme", "nvme")
    _, model_cfg = train.load_model_config("gpt2-tiny")
    left_alive = after_failed_build = None
    if "failed-initialize-first" in between:
        left_alive = failed_initialize(cfg, model_cfg)
    train.seed_everything(1234)
    model, _ = train.build_model("zero", model_cfg, json.loads(json.dumps(cfg)))
    stream = train.synthetic_batches(model_cfg.vocab_size, 2, 64, 1)
    states = []
    losses = []
    refused = None
    for round_ in range(2):
        if round_ == 1 and "refused-model-between" in between:
            refused = refused_model(cfg, model_cfg)
        if round_ == 0 and "stock-model-alongside" in between:
            refused = stock_model(cfg, model_cfg)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=json.loads(json.dumps(cfg)))
        losses += [train.train_step(engine, stream, 1).item() for _ in range(2)]
        engine.destroy()
        engine.destroy()
        if mode != "stock":
            stats = tencache_ds.stats(engine)
            states.append([stats.get("param_swapper_resting"), stats.get("param_swapper_closed"),
                           stats.get("optimizer_swapper_closed"),
                           stats.get("param_reserved_bytes") == 0])  # its slots given back
    if "failed-build-after" in between:
        after_failed_build = failed_build(model, cfg)
    print("RESULT " + json.dumps({"losses": losses, "states": states, "refused": refused, "left_alive": left_alive,
                                  "after_failed_build": after_failed_build}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
