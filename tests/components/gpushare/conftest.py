import threading
import time

import pytest


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread, as on a node running several jobs; restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_leftover_executor_threads():
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(("gpushare-", "naive-", "host"))]
        if not alive:
            return
        time.sleep(0.02)
    pytest.fail(f"threads left running: {alive}")
