import torch
from torch import nn

from components.gpushare.memory import AllocationMeter, measure_step, persistent_bytes, profile_workload
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload


def test_persistent_bytes_counts_parameters_gradients_optimizer_state_and_data_once():
    model = nn.Linear(10, 5)  # 55 float32 parameters = 220 bytes
    optimizer = torch.optim.Adam(model.parameters())
    assert persistent_bytes(model, optimizer).to_dict() == {
        "parameters": 220, "gradients": 0, "buffers": 0, "optimizer": 0, "data": 0, "total": 220}
    model(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    counted = persistent_bytes(model, optimizer)
    assert counted.gradients == 220
    assert counted.optimizer == 2 * 220 + 2 * 4  # exp_avg, exp_avg_sq, and a 0-dim step per parameter

    class Holder:  # like a Workload: a model, an optimizer and device-resident data as attributes
        def __init__(self):
            self.model, self.optimizer = model, optimizer
            self.data = torch.zeros(100)
            self.view = self.data[10:]  # shares data's storage: not counted twice

    assert persistent_bytes(Holder()).data == 400
    assert persistent_bytes(Holder()).total == counted.total + 400


def test_allocation_meter_tracks_the_peak_of_live_tensors():
    with AllocationMeter() as meter:
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(500)
        del a
        c = torch.empty(250)
        a_view = b[:10]  # a view: no new memory
    assert meter.peak == 6000
    assert meter.live == 3000
    del b, c, a_view
    assert meter.live == 0


def test_a_measured_training_step_sees_activations():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    inputs = torch.randn(128, 64)

    def step():
        model(inputs).sum().backward()

    _, peak = measure_step(step)
    activations = 128 * 256 * 4  # the hidden layer's output, saved for backward
    assert peak >= activations


def test_profile_workload_leaves_the_job_alone_and_matches_what_it_uses():
    spec = TrainSpec().validate({"workload": "mlp-digits", "hidden": 32})
    estimate = profile_workload(lambda: builtin_workload("mlp-digits"), spec, headroom=0.0, headroom_minimum=0)
    workload = builtin_workload("mlp-digits")
    workload.setup(spec, torch.device("cpu"))
    for index in range(2):
        workload.train_step(workload.batch(0, index))
    assert estimate.persistent == persistent_bytes(workload).total
    _, peak = measure_step(lambda: workload.train_step(workload.batch(0, 2)))
    assert 0 < estimate.ephemeral <= peak * 1.5 and peak <= estimate.ephemeral * 1.5
