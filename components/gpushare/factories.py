"""Workloads as the shared device's sessions take them: an instance, a class or a factory, turned into fresh
copies. :class:`~components.gpushare.sessions.WorkloadSession` and
:class:`~components.gpushare.stages.StagedWorkloadSession` both build their workloads here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any


def workload_factory(workload: Any) -> tuple[Any, Callable[[], Any]]:
    """``(workload or None, factory of fresh copies)`` for a Workload instance, class or factory.

    A Workload is cheap before ``setup()``: a deep copy of it is a fresh, independent job (used to profile
    memory on a throwaway copy without touching the job's own state)."""
    if isinstance(workload, type) or (callable(workload) and not hasattr(workload, "train_step")):
        return None, workload
    pristine = copy.deepcopy(workload)
    return workload, lambda: copy.deepcopy(pristine)
