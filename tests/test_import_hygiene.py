"""Dependency rules: the layers of docs/design.md hold (no import points up a layer, no cycle between packages),
`import tencache_ds` stays light, and only the DeepSpeed adapters import DeepSpeed."""
import ast
import os
import re
import subprocess
import sys

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tencache_ds")

# The layers, lowest first (docs/design.md, "Layers"; README's layout). A module may import modules of its own layer
# or of a lower one, and the leaves; never a higher layer. Units are tencache_ds's top-level modules and packages.
LAYERS = (
    ("config", {"config"}),
    ("profile", {"profile"}),
    ("plan", {"plan", "config_checks", "zero_sections", "preflight"}),
    ("memory/io", {"memory", "io"}),
    ("cache", {"cache"}),
    ("integrations", {"integrations"}),
    ("cli", {"cli", "bench"}),
    ("package", {"__init__"}),  # tencache_ds/__init__.py: the public face, imports the adapters on demand
)
# Leaves: used from every layer, and import nothing of tencache_ds but other leaves.
LEAVES = {"units", "errors", "log", "metrics", "drive_wear", "ext_lock", "probes", "supported_deepspeed"}


def imported_modules(path):
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def module_name(path):
    """tencache_ds.plan.budget for tencache_ds/plan/budget.py; tencache_ds.plan for its __init__.py."""
    relative = os.path.relpath(path, os.path.dirname(PACKAGE))[:-len(".py")].replace(os.sep, ".")
    return relative.removesuffix(".__init__")


def package_imports(path):
    """The tencache_ds modules ``path`` imports (relative imports resolved), at any depth (lazy imports count)."""
    me = module_name(path)
    package = me if path.endswith("__init__.py") else me.rpartition(".")[0]
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1])
            if node.module:
                yield f"{base}.{node.module}"
            else:
                yield from (f"{base}.{alias.name}" for alias in node.names)
        else:
            yield from (name for name in (imported_modules_of(node)) if name.split(".")[0] == "tencache_ds")


def imported_modules_of(node):
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def unit_of(module):
    """The top-level unit of a tencache_ds module: "plan" for tencache_ds.plan.budget, "__init__" for tencache_ds."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_graph():
    """{module: set of tencache_ds modules it imports} over the whole package."""
    graph = {}
    for folder, _dirs, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                graph[module_name(path)] = set(package_imports(path)) - {module_name(path)}
    return graph


def layer_violations(graph):
    """Imports that break the layer rules, as readable lines (empty: the layers hold)."""
    rank = {unit: index for index, (_name, units) in enumerate(LAYERS) for unit in units}
    problems = []
    for module, imports in sorted(graph.items()):
        unit = unit_of(module)
        if unit not in rank and unit not in LEAVES:
            problems.append(f"{module}: {unit} is in no layer (add it to LAYERS or LEAVES, and to docs/design.md)")
            continue
        for target in sorted(imports):
            target_unit = unit_of(target)
            if target_unit == unit or target_unit in LEAVES:
                continue
            if unit in LEAVES:
                problems.append(f"{module} -> {target}: a leaf imports only leaves")
            elif target_unit not in rank or rank[target_unit] > rank[unit]:
                problems.append(f"{module} -> {target}: points up from {unit} to {target_unit}")
    return problems


def unit_cycles(graph):
    """Cycles between units (packages), e.g. profile -> plan -> profile, as lists of units."""
    edges = {}
    for module, imports in graph.items():
        for target in imports:
            if unit_of(target) != unit_of(module):
                edges.setdefault(unit_of(module), set()).add(unit_of(target))
    cycles, state = [], {}

    def visit(unit, path):
        state[unit] = "open"
        for target in sorted(edges.get(unit, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[unit] = "done"

    for unit in sorted(edges):
        if unit not in state:
            visit(unit, [unit])
    return cycles


def test_no_import_points_up_a_layer():
    assert layer_violations(import_graph()) == []


def test_no_cycle_between_packages():
    assert unit_cycles(import_graph()) == []


def test_the_checks_catch_an_upward_import_and_a_cycle():
    """Each rule fails when broken: an import from plan up into cache, a leaf importing a layer, and the cycle the
    profile once had with plan (profile.lifecycle -> plan.next_use while plan.prefetch -> profile)."""
    graph = import_graph()
    upward = dict(graph, **{"tencache_ds.plan.budget": graph["tencache_ds.plan.budget"] | {"tencache_ds.cache.entry"}})
    assert layer_violations(upward) == ["tencache_ds.plan.budget -> tencache_ds.cache.entry: points up from plan "
                                        "to cache"]
    leaf = dict(graph, **{"tencache_ds.units": {"tencache_ds.config"}})
    assert layer_violations(leaf) == ["tencache_ds.units -> tencache_ds.config: a leaf imports only leaves"]
    cycle = dict(graph, **{"tencache_ds.profile.lifecycle": graph["tencache_ds.profile.lifecycle"] |
                           {"tencache_ds.plan.budget"}})
    assert ["plan", "profile", "plan"] in unit_cycles(cycle)


DESIGN = os.path.join(os.path.dirname(PACKAGE), "docs", "design.md")
UNCHECKED_UNITS = set()  # a layer whose picture is being redrawn may be left out here for a while


def design_layer_lines():
    """docs/design.md's layer picture as {layer label: its text}: a line that starts with a label ("plan",
    "integrations/deepspeed", "leaves", ...) opens a layer; indented lines continue it."""
    with open(DESIGN) as handle:
        text = handle.read()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    labels = {name for name, _units in LAYERS} | {"integrations/deepspeed", "leaves"}
    layers, current = {}, None
    for line in block.splitlines():
        label = line.split(" ", 1)[0]
        if label in labels:
            current = "integrations" if label == "integrations/deepspeed" else label
        if current is not None:
            layers[current] = layers.get(current, "") + " " + line
    return layers


def test_the_design_doc_names_every_module_in_its_layer():
    """Every module (a subpackage by its name) is named in its own layer's lines of docs/design.md's picture."""
    layer_of = {unit: name for name, units in LAYERS for unit in units}
    layer_of.update({unit: "leaves" for unit in LEAVES})
    pictured, missing = design_layer_lines(), []
    for module in sorted(import_graph()):
        parts = module.split(".")
        unit = unit_of(module)
        if unit in UNCHECKED_UNITS or unit == "__init__":
            continue
        name = parts[2] if len(parts) > 2 else parts[1]  # plan.step_model.stock -> step_model; config -> config
        if name.startswith("_"):
            continue
        if not re.search(rf"\b{re.escape(name)}\b", pictured.get(layer_of[unit], "")):
            missing.append(f"{module}: not named in the {layer_of[unit]} layer of docs/design.md")
    assert missing == []


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
    for layer in ("config.py", "config_checks.py", "zero_sections.py", "preflight.py", "units.py", "errors.py", "plan",
                  "profile", "probes"):
        root = os.path.join(PACKAGE, layer)
        paths = [root] if root.endswith(".py") else [os.path.join(folder, n) for folder, _dirs, names in os.walk(root)
                                                     for n in names if n.endswith(".py")]  # subpackages too
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


@pytest.mark.parametrize("module", ["install", "optimizer_swapper", "param_swapper", "coordinator"])
def test_importing_the_adapters_directly_installs_the_swappers(module):
    """Importing an adapter module first imports DeepSpeed before that module is done. The adapters' package
    imports DeepSpeed before any of its modules (integrations/deepspeed/__init__.py), so the hook installs from
    whole modules. Regression: importing optimizer_swapper first warned "could not install its swappers (...
    partially initialized module ...)" and the run refused tencache configs."""
    code = ("import warnings; warnings.simplefilter('error', UserWarning); "
            f"import tencache_ds.integrations.deepspeed.{module}; "
            "import tencache_ds.integrations.deepspeed.install as install; print(install.is_installed())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(PACKAGE)).stdout.split()
    assert out[-1] == "True"


def initialize_after_failed_install(block: str, *checks: str):
    """deepspeed.initialize with a config holding ``block`` as its "tencache" block, in a process where the
    adapters' module cannot be imported (the install fails); prints REFUSED and, per check, whether the error
    names it."""
    code = ("import sys; sys.modules['tencache_ds.integrations.deepspeed.install'] = None; "
            "import tencache_ds, deepspeed, torch\n"
            "try:\n"
            f"    deepspeed.initialize(model=torch.nn.Linear(2, 2), config={{'train_batch_size': 1, 'tencache': {block}}})\n"
            "except tencache_ds.TencacheError as err:\n"
            f"    print('REFUSED', *[check in str(err) for check in {list(checks)!r}])\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(PACKAGE))


def test_a_failed_install_refuses_a_tencache_config_instead_of_training_stock():
    """If the swappers cannot be installed when DeepSpeed is imported (here: the adapters' module cannot be
    imported), a run whose config enables tencache stops at deepspeed.initialize with the reason; a config
    without the block still runs stock."""
    proc = initialize_after_failed_install("{}", "could not install")
    assert "REFUSED True" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "could not install its swappers" in proc.stderr  # and it said so at import


def test_a_failed_install_refuses_an_invalid_tencache_block_too():
    """Regression test: with the install failed, a block that asks for tencache but does not parse ("lots" of
    bytes) was taken as "not enabled", and the run trained stock DeepSpeed. Now it stops, naming the key."""
    proc = initialize_after_failed_install("{'host_cache_bytes': 'lots'}", "host_cache_bytes", "could not install")
    assert "REFUSED True True" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
