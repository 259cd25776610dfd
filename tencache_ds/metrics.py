"""Per-step metrics as JSON lines. Owns: the file format and turning running counters into per-step deltas."""
import json
import os
import time
from typing import Dict, Iterable, Optional


class MetricsWriter:
    """Appends one flat JSON object per optimizer step to ``path``. Keys listed in ``counter_keys`` are running
    totals; each line carries their increase since the previous line as ``<key>_per_step``."""

    def __init__(self, path: str, counter_keys: Iterable[str]):
        self.path = path
        self._counter_keys = tuple(counter_keys)
        self._previous: Optional[Dict[str, float]] = None
        self._step = 0
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        self._handle = open(path, "a", buffering=1)

    def write(self, stats: Dict[str, object]) -> None:
        line = {"step": self._step, "time_unix_s": time.time()}
        line.update(stats)
        for key in self._counter_keys:
            if key in stats and isinstance(stats[key], (int, float)):
                before = self._previous.get(key, 0) if self._previous else 0
                line[f"{key}_per_step"] = stats[key] - before
        self._previous = {key: stats[key] for key in self._counter_keys if key in stats}
        self._handle.write(json.dumps(line, sort_keys=True) + "\n")
        self._step += 1

    def close(self) -> None:
        self._handle.close()
