"""GPU sharing (Salus + SwitchFlow): several jobs on one device with per-iteration switching, memory lanes
and stage-level preemption for inference.

- :mod:`.lanes` -- :class:`MemoryRequest` and the :class:`LaneAllocator` (pure, no torch: the control plane
  may import it);
- :mod:`.policies` -- PACK, SRTF, FAIR, PRIORITY, FIFO (pure);
- :mod:`.memory` -- measuring persistent and per-iteration memory (torch);
- :mod:`.sessions` -- jobs as step functions (Workload, TrainLoop, any ``step()``);
- :mod:`.stages` -- stage-preemptible training and inference sessions (SwitchFlow);
- :mod:`.executor` -- :class:`DeviceExecutor`, the per-device execution service;
- :mod:`.bench` -- ``run(quick)``: the four figures against their baselines.

Names are exported lazily so that importing the package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MemoryRequest": "lanes",
    "LaneAllocator": "lanes",
    "Admission": "lanes",
    "parse_bytes": "lanes",
    "Policy": "policies",
    "JobView": "policies",
    "get_policy": "policies",
    "persistent_bytes": "memory",
    "EphemeralMeter": "memory",
    "profile_workload": "memory",
    "Session": "sessions",
    "Progress": "sessions",
    "WorkloadSession": "sessions",
    "TrainLoopSession": "sessions",
    "as_session": "sessions",
    "StagedSession": "stages",
    "StagedWorkloadSession": "stages",
    "InferenceSession": "stages",
    "split_sequential": "stages",
    "DeviceExecutor": "executor",
    "JobState": "executor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
