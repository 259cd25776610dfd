"""What a run with an enabled "tencache" block refuses before it writes anything, as one sequence. Owns: the order
of the checks (a block misplaced inside one of DeepSpeed's sections, the block's own keys, DeepSpeed's sections,
the host budget against the machine, the files the block names), so that the run's initialize
(integrations/deepspeed/config_bridge.validate_ds_config), `tencache-ds doctor` and the bench's tencache arm refuse
the same configs with the same words. Does not own the checks themselves (config.py, zero_sections.py,
config_checks.py) nor DeepSpeed's version (contract.py: the run's caller passes it in).

Plain module: imports neither torch nor DeepSpeed.
"""
from typing import Callable, Optional

from .config import TencacheConfig, config_of_ds_dict
from .config_checks import check_host_budget, check_output_paths
from .plan.budget import MachineResources
from .zero_sections import check_zero_sections, reject_nested_blocks


def checked_block(raw: dict, machine: Optional[Callable[[], MachineResources]] = None,
                  before_sections: Callable[[], None] = lambda: None) -> TencacheConfig:
    """The parsed "tencache" block of DeepSpeed config dict ``raw``, after every check a run makes of it before a
    file is written. A disabled or absent block is only parsed (and a block misplaced inside a section refused,
    which would otherwise read as no block): such a run is stock DeepSpeed's. ``machine`` gives the machine the
    host budget is checked against (None: not checked here; doctor reports the budgets on a line of their own);
    ``before_sections`` runs once the block is known to be enabled (the run's DeepSpeed version check).

    Raises:
        TencacheConfigError, TencacheResourceError: naming the key as a dotted path, and the remedy.
    """
    reject_nested_blocks(raw)
    config = config_of_ds_dict(raw)
    if not config.enabled:
        return config
    before_sections()
    check_zero_sections(raw)
    if machine is not None:
        check_host_budget(config, machine())
    check_output_paths(config)
    return config
