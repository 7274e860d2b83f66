"""Scale the emulated links to this machine's compute, so that the network benchmark runs Atom where its premise
holds (node side: torch).

Who wins between the Atom swarm and a pipeline is decided by one dimensionless number: how long a pipeline stage
waits on its link for a token's activations, against how long it computes that token,

    rho = (a / L) / (c / F)

with ``a`` the bytes one token's activations put on a stage boundary (one direction: the gradients flow the other
way at the same time on a full-duplex link), ``L`` the link's bytes per second, ``c`` the training FLOPs of one
token in one stage (the model's FLOPs per token over the stages) and ``F`` the FLOP/s one stage computes at. An
emulation reproduces a real setting when ``rho`` is the same, so the emulated link is

    L_here = L_paper * (a_here / a_paper) * (c_paper / c_here) * (F_here / F_paper).

``F_here`` is measured (:func:`measure_compute`: one process, one torch thread, a training step of the benchmark's
model at a peer's batch, FLOPs counted exactly by ``torch.utils.flop_counter``), times the share of a core each
stage gets (``cores / stages``: the 4 stages run on this machine's 2 cores; the 4 peers likewise). ``F_paper`` is a
consumer GPU's tensor-core rate for mixed precision at a stated utilisation; ``a`` and ``c`` follow from the
models (:func:`gpt_flops_per_token`: Kaplan et al.'s ``6 N + 6 n_layer n_ctx d_model``).

The setting (:data:`PAPER`): Atom (Wu, Rao and Chen, arXiv 2403.10504) trains GPT-3 configurations on consumer-grade
GPUs over Ethernet, and reports its gains "in scenarios with suboptimal network connections". Taken here: GPT-3 XL
(1.3 B parameters, 24 layers, d_model 2048, context 2048: Brown et al. 2020, table 2.1 -- with Adam in mixed
precision it needs about 21 GB before activations, so it does not fit a 24 GB card, which is Atom's premise), an
RTX 3090 (71 TFLOPS dense FP16 tensor peak, 35.6 with FP32 accumulation as mixed-precision training uses;
50 % of that achieved), fp16 activations, 4 stages, and a 100 Mbit/s link (the suboptimal connection; 1 Gbit/s
Ethernet is converted too). The paper's own evaluation table was not available offline; these are its stated
ingredients with public figures for each.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """A real training setting: the model, the GPU and the link."""

    model: str
    parameters: float
    layers: int
    width: int
    context: int
    activation_bytes_per_element: int
    gpu: str
    gpu_peak_flops: float
    gpu_utilisation: float
    link_mbit: float
    stages: int = 4

    @property
    def gpu_flops(self) -> float:
        return self.gpu_peak_flops * self.gpu_utilisation

    def flops_per_token(self) -> float:
        return gpt_flops_per_token(self.parameters, self.layers, self.width, self.context)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpu_flops": self.gpu_flops, "flops_per_token": self.flops_per_token()}


PAPER = Setting(model="GPT-3 XL", parameters=1.3e9, layers=24, width=2048, context=2048,
                activation_bytes_per_element=2, gpu="RTX 3090", gpu_peak_flops=35.6e12, gpu_utilisation=0.5,
                link_mbit=100.0)


def gpt_flops_per_token(parameters: float, layers: int, width: int, context: int) -> float:
    """Training FLOPs (forward and backward) per token of a GPT: ``6 N + 6 n_layer n_ctx d_model``."""
    return 6.0 * parameters + 6.0 * layers * context * width


def measure_compute(model: str = "small", batch: int = 32, steps: int = 6, threads: int = 1) -> dict[str, Any]:
    """This machine's training rate on the benchmark's model: FLOPs of one forward and backward at ``batch``
    windows (counted by ``torch.utils.flop_counter.FlopCounterMode``), over the median time of ``steps`` steps
    (Adam included) in this process with ``threads`` torch threads."""
    import statistics

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from components.decentral.model import Corpus, ModelConfig, build_model, lm_loss

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        config = ModelConfig.named(model)
        net = build_model(config, 0)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        corpus = Corpus(0, config.context)
        inputs, targets = corpus.batch("scale", 0, batch)
        counter = FlopCounterMode(display=False)
        with counter:
            lm_loss(net(inputs), targets).backward()
        flops = float(counter.get_total_flops())
        times = []
        for step in range(steps + 1):
            inputs, targets = corpus.batch("scale", step, batch)
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            lm_loss(net(inputs), targets).backward()
            optimizer.step()
            if step:
                times.append(time.perf_counter() - started)
        seconds = statistics.median(times)
    finally:
        torch.set_num_threads(before)
    tokens = batch * config.context
    return {"model": model, "config": config.as_dict(), "batch": batch, "threads": threads,
            "flops_per_step": flops, "flops_per_token": flops / tokens, "step_s": seconds,
            "flops_per_s": flops / seconds, "tokens_per_s": tokens / seconds,
            "parameters": sum(p.numel() for p in net.parameters())}


def equivalent_link_mbit(measured: dict[str, Any], *, cores: int, stages: int = 4, setting: Setting = PAPER,
                         link_mbit: float | None = None) -> dict[str, Any]:
    """The emulated link (Mbit/s) at which the benchmark's model on this machine has the same ``rho`` as
    ``setting`` at ``link_mbit`` (default: the setting's link), with the factors that make it up."""
    link = setting.link_mbit if link_mbit is None else float(link_mbit)
    here_flops = measured["flops_per_s"] * min(1.0, cores / stages)  # each stage's share of the cores
    a_here = measured["config"]["width"] * 4  # fp32 activations
    a_paper = setting.width * setting.activation_bytes_per_element
    c_here = measured["flops_per_token"] / stages
    c_paper = setting.flops_per_token() / setting.stages
    compute_ratio = setting.gpu_flops / here_flops
    shape_ratio = (a_here / a_paper) * (c_paper / c_here)
    mbit = link * shape_ratio / compute_ratio
    return {"setting_link_mbit": link, "emulated_link_mbit": mbit,
            "gpu_vs_stage_compute": compute_ratio, "gpu_vs_machine_compute": setting.gpu_flops / (
                measured["flops_per_s"] * cores),
            "bytes_per_flop_here_vs_setting": shape_ratio, "stage_flops_per_s_here": here_flops,
            "activation_bytes_per_token": {"here": a_here, "setting": a_paper},
            "stage_flops_per_token": {"here": c_here, "setting": c_paper},
            "rho": (a_paper / (link * 1e6 / 8)) / (c_paper / setting.gpu_flops)}


def scaled_links(measured: dict[str, Any], *, cores: int, stages: int = 4,
                 setting: Setting = PAPER) -> dict[str, Any]:
    """The setting's link and 1 Gbit/s, each converted to this machine."""
    return {"setting": setting.as_dict(), "measured": measured,
            "at_setting_link": equivalent_link_mbit(measured, cores=cores, stages=stages, setting=setting),
            "at_1gbit": equivalent_link_mbit(measured, cores=cores, stages=stages, setting=setting,
                                             link_mbit=1000.0)}


if __name__ == "__main__":  # python -m benchmarks.decentral.scale
    import json
    import os

    print(json.dumps(scaled_links(measure_compute(), cores=os.cpu_count() or 1), indent=1))
