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
def no_leftover_threads():
    """Every executor and gRPC worker thread a test started has ended."""
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(("gpushare-", "serving-"))]
        if not alive:
            return
        time.sleep(0.02)
    pytest.fail(f"threads left running: {alive}")


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory):
    """A real ``model.pt``: mlp-digits trained for 3 epochs (69 steps) by a TrainLoop, as a train job saves it."""
    from components.runtime.contract.context import LocalContext
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({"workload": "mlp-digits", "hidden": 64, "seed": 3})
    ctx = LocalContext(job_id="train-job", attempt_id="attempt", spec=dict(spec),
                       workdir=tmp_path_factory.mktemp("train"))
    TrainLoop(builtin_workload("mlp-digits"), spec, ctx, owns_process=False).run()
    return ctx.artifacts["model.pt"]


@pytest.fixture(scope="session")
def digits_test_set():
    """The held-out digits of that job's split: ``(features, labels)`` as numpy arrays."""
    from components.train.spec import TrainSpec
    from components.train.workloads import MLPDigits

    spec = TrainSpec().validate({"workload": "mlp-digits", "hidden": 64, "seed": 3})
    _, _, features, labels = MLPDigits().load_data(spec)
    return features.numpy(), labels.numpy()
