"""Imported at start-up in ``.venv-triton`` (a ``.pth`` file, see the Makefile): a workaround for
triton-inference-server/pytriton#51.

Triton's Python-backend stub embeds an interpreter whose C ``RLock`` lacks ``_recursion_count`` (added in Python
3.11.6) and runs it with this machine's 3.11.7 standard library, whose multiprocessing resource tracker calls that
method; the model then fails to initialize. The tracker gets the pure-Python RLock, which has it.
"""

import _thread
import threading

if not hasattr(_thread.RLock(), "_recursion_count"):
    import multiprocessing.resource_tracker as _tracker

    _tracker._resource_tracker._lock = threading._PyRLock()
