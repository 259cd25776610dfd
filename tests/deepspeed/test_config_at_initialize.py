"""The config check at ``deepspeed.initialize`` (integrations/deepspeed/install.py): it runs before DeepSpeed reads
the config, so a block that could never take effect stops the run instead of leaving it silently stock."""
import argparse
import json
import os

import pytest
import torch

pytest.importorskip("deepspeed")
import deepspeed  # noqa: E402
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402

import tencache_ds  # noqa: E402
from tencache_ds.errors import TencacheConfigError  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def cpu_offload_config(**block):
    with open(os.path.join(CONFIGS, "stock-cpu.json")) as handle:
        config = json.load(handle)
    config["tencache"] = block
    return config


def test_deepspeed_rejects_a_block_inside_zero_optimization_itself():
    """What a zero.Init that comes before deepspeed.initialize shows (docs/reliability.md)."""
    with pytest.raises(Exception) as err:
        DeepSpeedZeroConfig(stage=3, tencache={})
    assert "tencache" in str(err.value) and "Extra inputs are not permitted" in str(err.value)


def test_initialize_names_a_misplaced_block_before_deepspeed_does():
    config = cpu_offload_config()
    config["zero_optimization"]["tencache"] = config.pop("tencache")
    with pytest.raises(TencacheConfigError, match="zero_optimization.tencache: .* top level"):
        deepspeed.initialize(model=torch.nn.Linear(2, 2), config=config)


@pytest.mark.parametrize("how", ["config", "config_params", "args"])
def test_initialize_refuses_a_block_with_nothing_on_nvme(how, tmp_path):
    config = cpu_offload_config()
    if how == "args":
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config))
        kwargs = {"args": argparse.Namespace(deepspeed_config=str(path))}
    else:
        kwargs = {how: config}
    with pytest.raises(TencacheConfigError, match="zero_optimization.offload_param.device"):
        deepspeed.initialize(model=torch.nn.Linear(2, 2), **kwargs)


def test_uninstall_gives_deepspeed_its_initialize_back_and_refuses_a_config_that_asks_for_tencache():
    """After uninstall a config without the block reaches DeepSpeed's own initialize; one that enables tencache is
    refused, saying why (until 2026-12-07 it trained stock, silently: helper-161's review); install() puts tencache's
    initialize back."""
    from tencache_ds.integrations.deepspeed.refusal import unrefused
    assert tencache_ds.integrations.deepspeed.install.is_installed()
    wrapped = deepspeed.initialize
    tencache_ds.uninstall()
    try:
        assert deepspeed.initialize is not wrapped and unrefused(deepspeed.initialize) is wrapped.__wrapped__
        with pytest.raises(tencache_ds.TencacheError, match=r"tencache_ds.uninstall\(\) took tencache's swappers out"):
            deepspeed.initialize(model=torch.nn.Linear(2, 2), config=dict(cpu_offload_config(), tencache={}))
        # a block misspelled or misplaced asks for tencache too: it trained stock (helper-206)
        misspelled = cpu_offload_config()
        misspelled["TenCache"] = misspelled.pop("tencache")
        misplaced = cpu_offload_config()
        misplaced["aio"] = {"tencache": misplaced.pop("tencache")}
        for config, named in ((misspelled, "TenCache: the block is spelled"), (misplaced, "aio.tencache: the")):
            with pytest.raises(tencache_ds.TencacheError, match=named + ".*took tencache's swappers out"):
                deepspeed.initialize(model=torch.nn.Linear(2, 2), config=config)
        refusal = deepspeed.initialize
        # a user's wrapper (a spy) around the refusal: its calls come back to it without looping (helper-167)
        deepspeed.initialize = lambda *args, **kwargs: refusal(*args, **kwargs)
        with pytest.raises(tencache_ds.TencacheError, match="took tencache's swappers out"):
            deepspeed.initialize(model=torch.nn.Linear(2, 2), config=dict(cpu_offload_config(), tencache={}))
        deepspeed.initialize = refusal
    finally:
        tencache_ds.install()
    assert deepspeed.initialize is wrapped


def test_a_config_that_asks_for_tencache_is_refused_while_no_auto_install_keeps_it_out(tmp_path):
    """TENCACHE_NO_AUTO_INSTALL=1: importing tencache_ds installs nothing, and until tencache_ds.install() a config
    that enables tencache is refused, not trained stock (helper-161's review); after install() it is validated."""
    import subprocess
    import sys
    code = ("import tencache_ds, deepspeed, torch\n"
            "from deepspeed import initialize as bound_early\n"
            "for step in ('before', 'after', 'bound early'):\n"
            "    if step == 'after':\n"
            "        tencache_ds.install()\n"
            "    call = bound_early if step == 'bound early' else deepspeed.initialize\n"
            "    try:\n"
            "        call(model=torch.nn.Linear(2, 2), config={'train_batch_size': 1, 'tencache': {}})\n"
            "    except tencache_ds.TencacheError as err:\n"
            "        print(step, 'REFUSED', 'TENCACHE_NO_AUTO_INSTALL' in str(err), 'zero_optimization' in str(err))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                          env=dict(os.environ, TENCACHE_NO_AUTO_INSTALL="1"), timeout=300)
    assert "before REFUSED True False" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "after REFUSED False True" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    # a name bound before install() reaches tencache's initialize after it (helper-164's review)
    assert "bound early REFUSED False True" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.deepspeed
def test_block_without_nvme_offload_stops_the_training_script(train):
    """End to end through scripts/train.py: "tencache": {} with params and optimizer offloaded to CPU."""
    failed = train(config="stock-cpu.json", block={}, expect_failure=True, steps=1)
    assert "TencacheConfigError" in failed.output
    assert "zero_optimization.offload_param.device / zero_optimization.offload_optimizer.device" in failed.output


def test_a_refusal_bound_before_install_hands_its_calls_to_tencaches_initialize_and_nests_right():
    """A name bound to the refusal (``from deepspeed import initialize`` while tencache is out) called after install()
    gets tencache's initialize, which validates its config, whatever deepspeed.initialize is then (a user's wrapper);
    inside tencache's initialize of one config, a nested call of another config through it is validated too, and the
    call of that same config reaches DeepSpeed's own (helper-167's and helper-168's reviews: a loop, and a nested
    config trained stock unvalidated)."""
    from tencache_ds.integrations.deepspeed.refusal import installed_call
    tencache_ds.uninstall()
    refusal = deepspeed.initialize
    tencache_ds.install()
    asks_for_tencache = {"train_batch_size": 1, "tencache": {}}  # on ZeRO stage 0: refused by the validation
    with pytest.raises(tencache_ds.TencacheError, match="zero_optimization.stage"):
        refusal(model=torch.nn.Linear(2, 2), config=asks_for_tencache)
    installed = deepspeed.initialize
    deepspeed.initialize = lambda *args, **kwargs: installed(*args, **kwargs)  # a user's wrapper, no mark
    try:
        with pytest.raises(tencache_ds.TencacheError, match="zero_optimization.stage"):
            refusal(model=torch.nn.Linear(2, 2), config=asks_for_tencache)
    finally:
        deepspeed.initialize = installed
    outer = {"train_batch_size": 1}
    with installed_call((None, outer, None)):
        with pytest.raises(tencache_ds.TencacheError, match="zero_optimization.stage"):
            refusal(model=torch.nn.Linear(2, 2), config=asks_for_tencache)
        with pytest.raises(AssertionError, match="requires a model"):  # the same call: DeepSpeed's own, no loop
            refusal(model=None, config=outer)


@pytest.mark.deepspeed
def test_a_client_torch_adagrad_with_the_optimizer_on_nvme_is_refused_where_a_sub_group_is_swapped(tmp_path):
    """A client torch.optim.Adagrad (deepspeed.initialize(optimizer=...)) with offload_optimizer on NVMe: stage 3
    rebuilds it over masters already swapped out, torch's Adagrad makes its state at construction, empty, and the
    first step stopped on "The size of tensor a (0) must match ..." (stock NVMe too; helper-240's review). Refused
    at the optimizer swapper's construction, before its folder is made, naming the config's "Adagrad", which works
    (DeepSpeedCPUAdagrad: tests/deepspeed/test_zero_scenarios.py). Not where no sub-group reaches the swap threshold
    (a small trial model): nothing is swapped, and it trains with the losses and fp32 weights of stock NVMe, run in a
    process that never imported tencache_ds (helper-242's review: refused there too until 2026-12-07)."""
    import subprocess
    import sys
    code = ("import os, sys, torch\n"
            "if sys.argv[1] == 'tencache':\n"
            "    import tencache_ds\n"
            "import deepspeed\n"
            "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(__import__('conftest').free_port()),\n"
            "                  RANK='0', WORLD_SIZE='1', LOCAL_RANK='0')\n"
            "torch.manual_seed(0)\n"
            "hidden = int(sys.argv[2])\n"
            "model = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden))\n"
            "config = {'train_micro_batch_size_per_gpu': 2, 'zero_allow_untested_optimizer': True,\n"
            "          'zero_force_ds_cpu_optimizer': False,\n"
            "          'zero_optimization': {'stage': 3,\n"
            "                                'offload_optimizer': {'device': 'nvme', 'nvme_path': sys.argv[3]}}}\n"
            "if sys.argv[1] == 'tencache':\n"
            "    config['tencache'] = {}\n"
            "try:\n"
            "    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.Adagrad(model.parameters()),\n"
            "                                      config=config)\n"
            "except Exception as err:\n"
            "    print('REFUSED', type(err).__name__, err)\n"
            "    raise SystemExit(0)\n"
            "generator = torch.Generator().manual_seed(1)\n"
            "losses = []\n"
            "for _ in range(3):\n"
            "    loss = engine(torch.randn(2, hidden, generator=generator)).pow(2).mean()\n"
            "    engine.backward(loss)\n"
            "    engine.step()\n"
            "    losses.append(loss.item())\n"
            "with deepspeed.zero.GatheredParameters(list(model.parameters())):\n"
            "    weights = [p.detach().float().clone() for p in model.parameters()]\n"
            "print('LOSSES', losses, 'WEIGHTS', __import__('hashlib').sha256(b''.join(\n"
            "    w.numpy().tobytes() for w in weights)).hexdigest())\n")

    def run(mode, hidden):
        nvme = tmp_path / f"{mode}-{hidden}"
        proc = subprocess.run([sys.executable, "-c", code, mode, str(hidden), str(nvme)], capture_output=True,
                              text=True, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)),
                              timeout=300)
        return proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:], nvme

    refused, output, nvme = run("tencache", 512)  # 1 MiB sub-groups a rank: swapped
    assert 'REFUSED TencacheConfigError offload_optimizer.device "nvme" with a client torch.optim.adagrad.Adagrad' \
        in refused, output
    assert '"optimizer": {"type": "Adagrad"' in refused
    assert not any("optimizer" in dirs for _, dirs, _ in os.walk(nvme))
    small = {mode: run(mode, 64) for mode in ("stock", "tencache")}  # 16 KiB: below the threshold, in memory
    losses = {mode: [line for line in stdout.splitlines() if line.startswith("LOSSES")]
              for mode, (stdout, _, _) in small.items()}
    assert len(losses["stock"]) == 1 and " WEIGHTS " in losses["stock"][0], small["stock"][1]
    assert losses["tencache"] == losses["stock"], small["tencache"][1]
