"""Dependency rules: `import tencache_ds` stays light, and only the DeepSpeed adapters import DeepSpeed."""
import ast
import os
import subprocess
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tencache_ds")


def imported_modules(path):
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_only_the_deepspeed_adapters_import_deepspeed():
    offenders = []
    for folder, _dirs, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, PACKAGE)
            if not name.endswith(".py") or relative.startswith(os.path.join("integrations", "deepspeed")):
                continue
            if relative.startswith("cli"):
                continue  # doctor probes DeepSpeed in a child process; it may name it
            if any(module == "deepspeed" or module.startswith("deepspeed.") for module in imported_modules(path)):
                offenders.append(relative)
    assert offenders == []


def test_pure_layers_import_neither_torch_nor_deepspeed():
    for layer in ("config.py", "config_checks.py", "units.py", "errors.py", "plan", "profile"):
        root = os.path.join(PACKAGE, layer)
        paths = [root] if root.endswith(".py") else [os.path.join(root, n) for n in os.listdir(root) if n.endswith(".py")]
        for path in paths:
            heavy = [m for m in imported_modules(path) if m.split(".")[0] in ("torch", "deepspeed")]
            assert heavy == [], (path, heavy)


def test_importing_the_package_loads_neither_deepspeed_nor_cuda():
    code = ("import sys, tencache_ds; "
            "print('deepspeed' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert out == ["False", "False"]


def test_importing_deepspeed_afterwards_installs_the_swappers():
    code = ("import tencache_ds, deepspeed.runtime.zero.partition_parameters as pp, deepspeed.runtime.zero.stage3 as s3; "
            "print(pp.AsyncPartitionedParameterSwapper.__name__, s3.PartitionedOptimizerSwapper.__name__, "
            "s3.PipelinedOptimizerSwapper.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert out[-3:] == ["TencacheParamSwapper", "TencacheOptimizerSwapper", "TencacheOptimizerSwapper"]


def test_a_lookup_of_deepspeed_is_not_mistaken_for_its_import():
    """Regression test: transformers/accelerate call find_spec("deepspeed") before DeepSpeed is imported; the
    install hook must survive that and still install on the real import."""
    code = ("import importlib.util, tencache_ds; importlib.util.find_spec('deepspeed'); "
            "importlib.util.find_spec('deepspeed'); import deepspeed; "
            "from tencache_ds.integrations.deepspeed.install import is_installed; print(is_installed())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert out[-1] == "True"


def test_importing_the_adapters_directly_installs_the_swappers():
    """`import tencache_ds.integrations.deepspeed.install` imports DeepSpeed from inside a module still being
    imported, where the import hook cannot install: the module installs when its own import finishes."""
    code = ("import warnings; warnings.simplefilter('error', UserWarning); "
            "import tencache_ds.integrations.deepspeed.install as install; print(install.is_installed())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert out[-1] == "True"


def test_a_failed_install_refuses_a_tencache_config_instead_of_training_stock():
    """If the swappers cannot be installed when DeepSpeed is imported (here: the adapters' module cannot be
    imported), a run whose config enables tencache stops at deepspeed.initialize with the reason; a config
    without the block still runs stock."""
    code = ("import sys; sys.modules['tencache_ds.integrations.deepspeed.install'] = None; "
            "import tencache_ds, deepspeed, torch\n"
            "try:\n"
            "    deepspeed.initialize(model=torch.nn.Linear(2, 2), config={'train_batch_size': 1, 'tencache': {}})\n"
            "except tencache_ds.TencacheError as err:\n"
            "    print('REFUSED', 'could not install' in str(err))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(PACKAGE))
    assert "REFUSED True" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "could not install its swappers" in proc.stderr  # and it said so at import
