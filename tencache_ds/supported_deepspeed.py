"""Which DeepSpeed releases tencache runs on. Owns: the supported series, the release the suite runs against, and
why another release cannot run. Plain module (no DeepSpeed import): `tencache-ds doctor` judges a version with the
same rule as ``deepspeed.initialize`` (integrations/deepspeed/contract.py ``require_supported_deepspeed``)."""
import re
from typing import Optional

SUPPORTED_SERIES = "0.19"    # releases 0.19.x: the private names contract.py checks are those of this series
TESTED_VERSION = "0.19.8"    # the release the test suite runs against


def series(version: str) -> str:
    """"0.19" of "0.19.8" (the version itself where it has no major.minor)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else version


def version_problem(version: str) -> Optional[str]:
    """Why DeepSpeed ``version`` cannot run tencache, or None when it can."""
    if series(version) == SUPPORTED_SERIES:
        return None
    return (f"DeepSpeed {version} is installed; tencache_ds supports DeepSpeed {SUPPORTED_SERIES}.x (tested with "
            f"{TESTED_VERSION}), whose private interfaces it relies on "
            f"(tencache_ds/integrations/deepspeed/contract.py): install deepspeed=={TESTED_VERSION}, or set "
            f'"tencache": {{"enabled": false}} to run stock DeepSpeed')
