"""Stage 3's step, as install.py wraps it: the host governor's rise meter takes a boundary before the update
(memory_pressure.HostTierGovernor.before_update), and an engine without a governor steps as before."""
from tencache_ds.integrations.deepspeed import install
from tencache_ds.integrations.deepspeed.memory_pressure import GOVERNOR_ATTRIBUTE


class Recorder:
    def __init__(self):
        self.calls = []

    def before_update(self):
        self.calls.append("boundary")


class Stage3:
    """Stands in for DeepSpeedZeroOptimizer_Stage3: only what the wrapper touches."""


def test_the_update_starts_after_the_governors_boundary():
    calls = Recorder()
    step = install.REPLACEMENTS["marking_step"](lambda self: calls.calls.append("update") or "stepped")
    optimizer = Stage3()
    setattr(optimizer, GOVERNOR_ATTRIBUTE, calls)
    assert step(optimizer) == "stepped"
    assert calls.calls == ["boundary", "update"]
    assert step(Stage3()) == "stepped"  # no governor (stock swappers): nothing else happens
    assert calls.calls == ["boundary", "update", "update"]
