"""The pipeline-parallel baseline: synchronous pipeline training over stage processes linked by throttled TCP
(node side: torch).

This is what SWARM- or Petals-style training does over a slow network, and what the Atom swarm
(:mod:`components.decentral`) is compared with: each of ``stages`` processes holds a contiguous slice of
:func:`~components.decentral.model.model_layers` (the embedding, the blocks, the head), balanced by parameter
count (:func:`partition`), and every micro-batch's activations cross the network forward and its activation
gradients backward. Per step (GPipe: synchronous, gradients accumulated over the micro-batches, a flush):

* stage 0 cuts the step's batch -- ``Corpus(seed).batch(data_peer, step, micro_batches * micro_batch_size)``
  -- into ``micro_batches`` micro-batches of ``micro_batch_size`` windows and runs each forward through its
  layers, sending the activations on; a middle stage runs each one it receives and sends the result on;
* the last stage computes each micro-batch's loss (scaled by ``1 / micro_batches``: the accumulated gradient
  is the gradient of the step's mean loss) and runs its backward at once, sending the gradient of its input
  back; the other stages run each micro-batch's backward when its gradient arrives and pass the gradient of
  their input on;
* each stage takes its Adam step after its ``micro_batches`` backwards.

So the pipeline trains exactly as one process would on the same batches (the test checks the losses and
parameters against :func:`single_process_reference`). Every stage reads the batch itself (the corpus is a pure
function of ``(seed, peer, step)``), so the targets never cross the network -- an advantage to the baseline.

Schedules (``schedule``), all with the same gradients; they differ only in when a stage runs what:

* ``"gpipe"``: every forward, then every backward (GPipe);
* ``"1f1b"``: ``stages - index - 1`` forwards to fill the pipeline, then one forward and one backward in turn
  (PipeDream-Flush); its small warm-up assumes transfers are free, so on a slow link a stage waits;
* ``"eager"`` (the default, the fastest here): a stage runs whatever has arrived, in arrival order, and the
  first stage its next forward whenever no gradient is waiting, so activations and gradients are on a link at
  the same time (the links are full duplex). Measured on ``small``, 4 stages, 16 x 8 windows, 2 shared cores:
  0.56 s a step at 100 Mbit/s against 0.8 s for gpipe and 1f1b.

GPipe's fill and drain (the bubble, ``(stages - 1) / (micro_batches + stages - 1)`` of the compute) are
inherent to all three.

Links: stage ``s`` connects to stage ``s + 1`` through a :class:`~benchmarks.decentral.throttle.ThrottledProxy`
(``mbit`` Mbit/s each way, ``latency_ms`` one way) in the parent process; activations flow with the connection,
gradients against it; a link opens with the run's random token (a stage listens on 127.0.0.1 and trusts only
the connection that presents it). Each end has a sender thread (the stage computes micro-batch ``m + 1`` while ``m`` is on
the wire) and a receiver thread (the next tensors arrive while it computes). A frame is a fixed header (kind,
dtype code, number of dimensions, micro-batch, step), the shape, then the raw bytes: nothing is unpickled from
a socket, and a header is checked before its payload is read. ``torch.distributed.pipelining``'s
``ScheduleGPipe`` runs on CPU and gloo, but gloo dials the ranks itself (addresses from its store), so its
traffic could not be made to cross our proxies; that is why the stages have their own sockets.

Each stage process (``multiprocessing`` spawn) runs ``torch.set_num_threads(1)``. :func:`run_pipeline` reaps
every child (killing them on an error or on ``timeout_s``) and raises :class:`PipelineError` naming the stage
that failed or died (not the neighbours whose connections it took down).
"""

from __future__ import annotations

import contextlib
import hmac
import math
import multiprocessing as mp
import os
import queue
import secrets
import socket
import struct
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from benchmarks.decentral.throttle import ThrottledProxy

KIND_ACTIVATION = 1
KIND_GRADIENT = 2
HEADER = struct.Struct("<BBBxIQ")  # kind, dtype code, ndim, (pad), micro-batch, step
MAX_DIMS = 8
MAX_FRAME_BYTES = 1 << 31
DEFAULT_TIMEOUT_S = 600.0
HELLO_BYTES = 16  # a link opens with the run's random token, so a stage only trusts its own neighbour
HELLO_TIMEOUT_S = 10.0
SCHEDULES = ("eager", "1f1b", "gpipe")
DTYPE_NAMES = {1: "float32", 2: "float16", 3: "bfloat16", 4: "float64", 5: "int64"}


class PipelineError(RuntimeError):
    """A stage of the pipeline failed or died."""


# -- partition and frames (pure) ---------------------------------------------------------------------------

def partition(sizes: Sequence[int], stages: int) -> list[tuple[int, int]]:
    """Split ``sizes`` (one per layer, in order) into ``stages`` contiguous non-empty ranges ``[lo, hi)`` so that
    the largest range sum is as small as possible (ties: the earliest such split): gpushare's exact partition
    (:func:`components.gpushare.stages.partition`), as ranges."""
    from components.gpushare.stages import partition as balanced

    n = len(sizes)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} stages (1 to {n})")
    bounds, low = [], 0
    for count in balanced([float(size) for size in sizes], stages):
        bounds.append((low, low + count))
        low += count
    return bounds


def frame_bytes(shape: Sequence[int], element_size: int = 4) -> int:
    """Bytes one frame of a tensor of ``shape`` takes on the wire."""
    return HEADER.size + 8 * len(shape) + math.prod(shape) * element_size


def _dtypes():
    import torch

    return {1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float64, 5: torch.int64}


def encode_frame(kind: int, step: int, micro: int, tensor) -> tuple[bytes, memoryview]:
    """The header (with the shape) and the payload of one tensor frame."""
    import torch

    codes = {dtype: code for code, dtype in _dtypes().items()}
    if tensor.dtype not in codes:
        raise TypeError(f"cannot frame a tensor of dtype {tensor.dtype}")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"cannot frame a tensor of {tensor.dim()} dimensions (at most {MAX_DIMS})")
    tensor = tensor.detach().contiguous()
    header = HEADER.pack(kind, codes[tensor.dtype], tensor.dim(), micro, step)
    header += struct.pack(f"<{tensor.dim()}Q", *tensor.shape)
    if not tensor.numel():
        return header, memoryview(b"")
    return header, memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def _recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    """Exactly ``n`` bytes, or None on a clean end of stream before the first byte."""
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        count = sock.recv_into(view[got:], n - got)
        if count == 0:
            if got == 0:
                return None
            raise ConnectionError(f"the connection closed in the middle of a frame ({got} of {n} bytes)")
        got += count
    return buffer


def read_frame(sock: socket.socket) -> tuple[int, int, int, Any, int] | None:
    """One frame from ``sock``: ``(kind, step, micro, tensor, wire_bytes)``; None at a clean end of stream.
    The header is checked (kind, dtype, number of dimensions, size) before any payload is read."""
    import torch

    head = _recv_exact(sock, HEADER.size)
    if head is None:
        return None
    kind, code, ndim, micro, step = HEADER.unpack(head)
    dtypes = _dtypes()
    if kind not in (KIND_ACTIVATION, KIND_GRADIENT):
        raise ValueError(f"bad frame kind {kind}")
    if code not in dtypes or ndim > MAX_DIMS:
        raise ValueError(f"bad frame header (dtype code {code}, {ndim} dimensions)")
    dims = _recv_exact(sock, 8 * ndim) if ndim else bytearray()
    if dims is None:
        raise ConnectionError("the connection closed in the middle of a frame")
    shape = struct.unpack(f"<{ndim}Q", dims)
    dtype = dtypes[code]
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {nbytes} bytes is over the limit of {MAX_FRAME_BYTES}")
    payload = _recv_exact(sock, nbytes) if nbytes else bytearray()
    if payload is None:
        raise ConnectionError("the connection closed in the middle of a frame")
    if nbytes:
        tensor = torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        tensor = torch.empty(shape, dtype=dtype)
    return kind, step, micro, tensor, HEADER.size + 8 * ndim + nbytes


CLOSED = 0  # an inbox item: (CLOSED, link name, None, None) at the end of a link's stream
FAILED = -1  # (FAILED, link name, the exception, None) when its receiver failed


class _Link:
    """One end of a stage-to-stage connection: a sender thread draining :meth:`send`'s queue and a receiver
    thread putting each frame ``(kind, step, micro, tensor)`` into ``inbox`` (shared by a stage's links)."""

    def __init__(self, sock: socket.socket, name: str, inbox: queue.Queue):
        self.sock, self.name, self.inbox = sock, name, inbox
        self.outbox: queue.Queue = queue.Queue()
        self.bytes_sent = 0
        self.bytes_received = 0
        self.send_s = 0.0
        self._sender = threading.Thread(target=self._send_loop, name=f"{name}-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name=f"{name}-recv", daemon=True)
        self._sender.start()
        self._receiver.start()

    def send(self, kind: int, step: int, micro: int, tensor) -> None:
        self.outbox.put((kind, step, micro, tensor.detach()))

    def _send_loop(self) -> None:
        try:
            while (item := self.outbox.get()) is not None:
                kind, step, micro, tensor = item
                header, payload = encode_frame(kind, step, micro, tensor)
                started = time.perf_counter()
                self.sock.sendall(header)
                if len(payload):
                    self.sock.sendall(payload)
                self.send_s += time.perf_counter() - started
                self.bytes_sent += len(header) + len(payload)
        except BaseException as error:  # noqa: BLE001 -- handed to the compute thread
            self.inbox.put((FAILED, self.name, error, None))

    def _receive_loop(self) -> None:
        try:
            while (frame := read_frame(self.sock)) is not None:
                kind, step, micro, tensor, nbytes = frame
                self.bytes_received += nbytes
                self.inbox.put((kind, step, micro, tensor))
            self.inbox.put((CLOSED, self.name, None, None))
        except BaseException as error:  # noqa: BLE001 -- handed to the compute thread
            self.inbox.put((FAILED, self.name, error, None))

    def finish(self, timeout: float) -> None:
        """Send what is queued, then half-close (the other end reads to the end of the stream)."""
        self.outbox.put(None)
        self._sender.join(timeout)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)


class _Mailbox:
    """What a stage's links delivered, taken by kind (:meth:`take`) or in arrival order (:meth:`take_any`).
    Nothing of a later step can arrive before a stage finished the current one (the stage before it needs
    all of this step's gradients first), so a frame of another step is an error; so is a link that closed or
    failed while the stage still waits."""

    def __init__(self, inbox: queue.Queue, deadline: float, micro_batches: int):
        self.inbox, self.deadline, self.micro_batches = inbox, deadline, micro_batches
        self.pending: list[tuple[int, int, int, Any]] = []

    def _pull(self, block: bool) -> tuple[int, int, int, Any] | None:
        try:
            item = self.inbox.get(timeout=max(0.0, self.deadline - time.monotonic())) if block \
                else self.inbox.get_nowait()
        except queue.Empty:
            if block:
                raise TimeoutError("no frame arrived before the deadline") from None
            return None
        kind, name, detail, _ = item
        if kind == CLOSED:
            raise ConnectionError(f"{name}: the other stage closed the connection")
        if kind == FAILED:
            raise ConnectionError(f"{name}: {type(detail).__name__}: {detail}") from detail
        return item

    def _check(self, item, step: int) -> tuple[int, int, Any]:
        kind, got_step, micro, tensor = item
        if got_step != step or not 0 <= micro < self.micro_batches:
            raise RuntimeError(f"unexpected frame (kind {kind}, step {got_step}, micro-batch {micro}) "
                               f"during step {step}")
        return kind, micro, tensor

    def take(self, kind: int, step: int) -> tuple[int, Any]:
        """The first frame of ``kind``: ``(micro, tensor)``; others that arrive meanwhile wait their turn."""
        for position, item in enumerate(self.pending):
            if item[0] == kind:
                return self._check(self.pending.pop(position), step)[1:]
        while True:
            item = self._pull(block=True)
            if item[0] == kind:
                return self._check(item, step)[1:]
            self.pending.append(item)

    def take_any(self, step: int, block: bool = True) -> tuple[int, int, Any] | None:
        """The oldest frame of any kind: ``(kind, micro, tensor)``; None if ``block`` is false and none is
        there."""
        if self.pending:
            return self._check(self.pending.pop(0), step)
        item = self._pull(block)
        return None if item is None else self._check(item, step)


# -- a stage process ---------------------------------------------------------------------------------------

def _stage_main(index: int, spec: dict[str, Any], control: Connection) -> None:
    """One stage: listen (unless first), connect downstream (unless last), train, report."""
    links: list[_Link] = []
    try:
        import torch

        torch.set_num_threads(1)
        _run_stage(index, spec, control, links)
    except BaseException as error:  # noqa: BLE001 -- reported to the parent, then the process exits 1
        with contextlib.suppress(Exception):
            control.send(("error", index, f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
        for link in links:
            with contextlib.suppress(OSError):
                link.sock.close()
        raise SystemExit(1) from None


def _expect(control: Connection, kind: str, deadline: float) -> tuple:
    if not control.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"the parent sent no {kind!r} in time")
    message = control.recv()
    if message[0] != kind:
        raise RuntimeError(f"expected {kind!r} from the parent, got {message[0]!r}")
    return message


def _accept_stage(server: socket.socket, token: bytes, deadline: float) -> socket.socket:
    """The first connection that opens with this run's token (others are closed)."""
    while True:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        sock, _ = server.accept()
        try:
            sock.settimeout(min(HELLO_TIMEOUT_S, max(0.1, deadline - time.monotonic())))
            hello = _recv_exact(sock, len(token))
        except OSError:
            hello = None
        if hello is not None and hmac.compare_digest(bytes(hello), token):
            return sock
        sock.close()
        if time.monotonic() > deadline:
            raise TimeoutError("the stage before never connected")


def _run_stage(index: int, spec: dict[str, Any], control: Connection, links: list[_Link]) -> None:
    import torch
    from torch import nn

    from components.decentral.model import Corpus, ModelConfig, build_model, lm_loss, model_layers

    deadline = time.monotonic() + spec["timeout_s"]
    stages, lo, hi = spec["stages"], *spec["bounds"][index]
    first, last = index == 0, index == stages - 1
    config = ModelConfig(**spec["config"])
    model = build_model(config, spec["seed"])
    module = nn.Sequential(*model_layers(model)[lo:hi])
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    parameters = list(module.parameters())
    optimizer = torch.optim.Adam(parameters, lr=spec["lr"])
    corpus = Corpus(spec["seed"], context=config.context) if first or last else None
    micro_batches, size = spec["micro_batches"], spec["micro_batch_size"]

    server = None
    if not first:
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(spec["timeout_s"])
    control.send(("listening", index, server.getsockname()[1] if server else None))
    _, downstream_address = _expect(control, "connect", deadline)
    down = up = None
    inbox: queue.Queue = queue.Queue()
    if downstream_address is not None:
        host, port = downstream_address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=spec["timeout_s"])
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(bytes.fromhex(spec["token"]))  # who we are: the run's stage, not a stray connection
        down = _Link(sock, f"stage {index} -> {index + 1}", inbox)
        links.append(down)
    if server is not None:
        sock = _accept_stage(server, bytes.fromhex(spec["token"]), deadline)
        server.close()
        sock.settimeout(spec["timeout_s"])
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up = _Link(sock, f"stage {index} <- {index - 1}", inbox)
        links.append(up)
    control.send(("ready", index))
    _expect(control, "go", deadline)

    mailbox = _Mailbox(inbox, deadline, micro_batches)
    step_ends, losses = [], []
    compute = [0.0]

    def forward(step: int, micro: int, x, targets, saved: dict, step_losses: list) -> None:
        if not first:
            x.requires_grad_(True)
        started = time.perf_counter()
        out = module(x)
        if last:  # the loss, and its backward at once
            loss = lm_loss(out, targets[micro])
            (loss / micro_batches).backward()
            step_losses.append(float(loss.detach()))
            compute[0] += time.perf_counter() - started
            if not first:
                up.send(KIND_GRADIENT, step, micro, x.grad)
        else:
            compute[0] += time.perf_counter() - started
            down.send(KIND_ACTIVATION, step, micro, out)
            saved[micro] = (x, out)

    def backward(step: int, micro: int, gradient, saved: dict) -> None:
        if micro not in saved:
            raise RuntimeError(f"stage {index}: a gradient for micro-batch {micro}, which is not pending")
        x, out = saved.pop(micro)
        started = time.perf_counter()
        out.backward(gradient)
        compute[0] += time.perf_counter() - started
        if not first:
            up.send(KIND_GRADIENT, step, micro, x.grad)

    def activation(step: int, micro: int, inputs):
        if first:
            return inputs[micro]
        got, x = mailbox.take(KIND_ACTIVATION, step)
        if got != micro:
            raise RuntimeError(f"stage {index}: micro-batch {got} arrived where {micro} was expected")
        return x

    schedule = spec["schedule"]
    # GPipe: every forward, then every backward. 1F1B: (stages - index - 1) forwards to fill the pipeline,
    # then one forward and one backward in turn, then the remaining backwards.
    warmup = micro_batches if schedule == "gpipe" else min(stages - index - 1, micro_batches)
    fault = spec.get("fault")
    for step in range(spec["steps"]):
        if fault is not None and fault[0] == index and fault[1] == step:
            if fault[2] == "exit":
                os._exit(3)
            raise RuntimeError(f"injected fault at step {step}")
        inputs = targets = None
        if corpus is not None:
            inputs, targets = corpus.batch(spec["data_peer"], step, micro_batches * size)
            inputs, targets = inputs.split(size), targets.split(size)
        saved: dict[int, tuple[Any, Any]] = {}
        step_losses: list[float] = []
        if schedule == "eager":
            # Whatever has arrived, in arrival order; the first stage runs its next forward whenever no
            # gradient is waiting. Forwards and backwards interleave as the links deliver.
            forwards, backwards = 0, 0
            while forwards < micro_batches or (not last and backwards < micro_batches):
                item = None
                if first:
                    item = mailbox.take_any(step, block=False)
                    if item is None and forwards < micro_batches:
                        forward(step, forwards, inputs[forwards], targets, saved, step_losses)
                        forwards += 1
                        continue
                if item is None:
                    item = mailbox.take_any(step)
                kind, micro, tensor = item
                if kind == KIND_ACTIVATION:
                    if micro != forwards:
                        raise RuntimeError(f"stage {index}: micro-batch {micro} arrived where {forwards} was due")
                    forward(step, micro, tensor, targets, saved, step_losses)
                    forwards += 1
                else:
                    backward(step, micro, tensor, saved)
                    backwards += 1
        else:
            for micro in range(warmup):
                forward(step, micro, activation(step, micro, inputs), targets, saved, step_losses)
            for micro in range(warmup, micro_batches):
                forward(step, micro, activation(step, micro, inputs), targets, saved, step_losses)
                if not last:
                    backward(step, *mailbox.take(KIND_GRADIENT, step), saved)
            if not last:
                for _ in range(warmup):
                    backward(step, *mailbox.take(KIND_GRADIENT, step), saved)
        if saved:
            raise RuntimeError(f"stage {index}: micro-batches {sorted(saved)} got no gradient")
        started = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        compute[0] += time.perf_counter() - started
        step_ends.append(time.time())
        if last:
            losses.append(sum(step_losses) / len(step_losses))
    for link in links:
        link.finish(max(1.0, deadline - time.monotonic()))
    result = {"stage": index, "step_ends": step_ends, "losses": losses, "compute_s": compute[0],
              "bytes_sent": sum(link.bytes_sent for link in links),
              "bytes_received": sum(link.bytes_received for link in links),
              "send_s": sum(link.send_s for link in links),
              "parameters": sum(p.numel() for p in parameters)}
    if spec["return_parameters"]:
        result["state"] = {names[id(p)]: p.detach().numpy().copy() for p in parameters}
    control.send(("done", index, result))
    for link in links:
        with contextlib.suppress(OSError):
            link.sock.close()


# -- the parent --------------------------------------------------------------------------------------------

def run_pipeline(config, *, stages: int, micro_batches: int, micro_batch_size: int, steps: int,
                 mbit: float | None, latency_ms: float = 0.0, seed: int = 0, lr: float = 1e-3,
                 data_peer: str | int = "pipeline", schedule: str = "eager",
                 timeout_s: float = DEFAULT_TIMEOUT_S, return_parameters: bool = False,
                 _fault: tuple[int, int, str] | None = None) -> dict[str, Any]:
    """Train ``config`` (a :class:`~components.decentral.model.ModelConfig` or a size name) for ``steps``
    synchronous pipeline steps of ``micro_batches`` x ``micro_batch_size`` windows over ``stages`` processes,
    linked through proxies of ``mbit`` Mbit/s each way (None: unthrottled) and ``latency_ms`` one way, with
    Adam (``lr``) and the given ``schedule`` (``"eager"``, ``"1f1b"`` or ``"gpipe"``; see the module).

    Returns ``tokens_per_s`` (``steps * micro_batches * micro_batch_size * context`` tokens over the wall time
    from the start signal to the last stage's last optimizer step; process start-up and connection set-up are
    reported apart as ``startup_s``), ``steady_tokens_per_s`` (without the first step), ``losses`` (the
    step's mean micro-batch loss), ``step_s``, the bytes over the links (``bytes_forward``: activations,
    ``bytes_backward``: gradients, as counted by the proxies; a link's first :data:`HELLO_BYTES` forward are
    its token), the partition, and each stage's compute time;
    with ``return_parameters`` also ``state``: every parameter after the last step, by the model's names (numpy
    arrays). Raises :class:`PipelineError` if a stage fails or dies and :class:`TimeoutError` after
    ``timeout_s``; every stage process is reaped either way. ``_fault`` (tests only): ``(stage, step, "exit")``
    makes that stage exit abruptly (code 3) at the start of that step, ``(stage, step, "raise")`` fail."""
    from components.decentral.model import ModelConfig, build_model, model_layers

    if isinstance(config, str):
        config = ModelConfig.named(config)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    for name, value in (("micro_batches", micro_batches), ("micro_batch_size", micro_batch_size),
                        ("steps", steps)):
        if int(value) < 1:
            raise ValueError(f"{name} must be at least 1, not {value!r}")
    model = build_model(config, seed)
    layers = model_layers(model)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    bounds = partition(sizes, stages)
    del model, layers
    spec = {"config": config.as_dict(), "seed": int(seed), "stages": int(stages), "bounds": bounds,
            "micro_batches": int(micro_batches), "micro_batch_size": int(micro_batch_size),
            "steps": int(steps), "lr": float(lr), "data_peer": data_peer, "timeout_s": float(timeout_s),
            "return_parameters": bool(return_parameters), "schedule": schedule,
            "fault": tuple(_fault) if _fault is not None else None, "token": secrets.token_hex(HELLO_BYTES)}
    started = time.monotonic()
    deadline = started + float(timeout_s)
    context = mp.get_context("spawn")
    processes: list[mp.Process] = []
    controls: list[Connection] = []
    proxies: list[ThrottledProxy] = []
    finished = False
    try:
        for index in range(stages):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_stage_main, args=(index, spec, child_end),
                                      name=f"pipeline-stage-{index}", daemon=True)
            process.start()
            child_end.close()
            processes.append(process)
            controls.append(parent_end)
        listening = _gather(processes, controls, "listening", deadline)
        for index in range(stages - 1):
            port = listening[index + 1][0]
            proxies.append(ThrottledProxy("127.0.0.1", port, mbit=mbit, latency_ms=latency_ms).start())
        for index, control in enumerate(controls):
            control.send(("connect", proxies[index].address if index < stages - 1 else None))
        _gather(processes, controls, "ready", deadline)
        go = time.time()
        startup_s = time.monotonic() - started
        for control in controls:
            control.send(("go",))
        done = [message[0] for message in _gather(processes, controls, "done", deadline)]
        finished = True
    finally:
        _reap(processes, grace_s=10.0 if finished else 0.0)
        for control in controls:
            control.close()
        for proxy in proxies:
            proxy.stop()

    ends = [max(result["step_ends"][step] for result in done) for step in range(steps)]
    step_s = [ends[0] - go] + [ends[step] - ends[step - 1] for step in range(1, steps)]
    wall_s = ends[-1] - go
    tokens_per_step = micro_batches * micro_batch_size * config.context
    activation = [micro_batch_size, config.context, config.width]
    out: dict[str, Any] = {
        "config": config.as_dict(), "stages": stages, "partition": bounds,
        "stage_parameters": [sum(sizes[lo:hi]) for lo, hi in bounds],
        "micro_batches": micro_batches, "micro_batch_size": micro_batch_size, "steps": steps,
        "mbit": mbit, "latency_ms": latency_ms, "lr": lr, "seed": seed, "schedule": schedule,
        "tokens": steps * tokens_per_step, "tokens_per_step": tokens_per_step,
        "wall_s": wall_s, "startup_s": startup_s, "step_s": step_s,
        "tokens_per_s": steps * tokens_per_step / wall_s if wall_s > 0 else math.inf,
        "steady_tokens_per_s": ((steps - 1) * tokens_per_step / sum(step_s[1:])
                                if steps > 1 and sum(step_s[1:]) > 0 else None),
        "losses": done[-1]["losses"],
        "bytes_forward": sum(proxy.bytes_to_target for proxy in proxies),
        "bytes_backward": sum(proxy.bytes_from_target for proxy in proxies),
        "frame_bytes": frame_bytes(activation),
        "compute_s": [result["compute_s"] for result in done],
        "send_s": [result["send_s"] for result in done],
    }
    out["bytes"] = out["bytes_forward"] + out["bytes_backward"]
    if return_parameters:
        out["state"] = {name: value for result in done for name, value in result["state"].items()}
    return out


def _gather(processes: list, controls: list[Connection], kind: str, deadline: float) -> list[tuple]:
    """The ``kind`` message of every stage (its payload after the stage index), in stage order; raises
    :class:`PipelineError` when a stage reports an error or dies first, :class:`TimeoutError` at the deadline."""
    got: dict[int, tuple] = {}
    while len(got) < len(controls):
        waiting = [index for index in range(len(controls)) if index not in got]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"pipeline stages {waiting} sent no {kind!r} before the deadline")
        handles = {controls[index]: index for index in waiting}
        sentinels = {processes[index].sentinel: index for index in waiting}
        ready = wait([*handles, *sentinels], timeout=min(remaining, 1.0))
        for handle in ready:
            if handle in handles:
                index = handles[handle]
                try:
                    message = controls[index].recv()
                except (EOFError, OSError):
                    continue  # the stage is gone: its sentinel says so
                if message[0] == "error":
                    _fail(processes, controls, {index: message[2]})
                if message[0] != kind:
                    raise PipelineError(f"pipeline stage {index} sent {message[0]!r} where {kind!r} was due")
                got[index] = tuple(message[2:])
            else:
                index = sentinels[handle]
                if index in got or controls[index].poll():
                    continue  # its last message is still to be read
                _fail(processes, controls, {})
    return [got[index] for index in range(len(controls))]


def _fail(processes: list, controls: list[Connection], errors: dict[int, str], settle_s: float = 1.0):
    """Raise the :class:`PipelineError` that names the root cause. One failed stage takes its neighbours down
    (their connections close), so collect for a moment the errors the others report and the stages that die,
    then blame a stage that failed on its own (not of a closed connection), else one that died, else the first
    error."""
    deadline = time.monotonic() + settle_s
    while True:
        for index, control in enumerate(controls):
            with contextlib.suppress(EOFError, OSError):
                while index not in errors and control.poll():
                    message = control.recv()
                    if message[0] == "error":
                        errors[index] = message[2]
        dead = {index: process.exitcode for index, process in enumerate(processes)
                if process.exitcode not in (None, 0) and index not in errors}
        if time.monotonic() >= deadline or any(not _knock_on(detail) for detail in errors.values()):
            break
        time.sleep(0.05)
    own = [index for index, detail in errors.items() if not _knock_on(detail)]
    if own:
        index, detail = own[0], errors[own[0]]
    elif dead:
        index = min(dead)
        detail = f"the process died (exit code {dead[index]})"
    elif errors:
        index, detail = next(iter(errors.items()))
    else:
        raise PipelineError("a pipeline stage died and none reported why")
    others = [f"stage {other}: {errors[other].splitlines()[0]}" for other in errors if other != index]
    others += [f"stage {other} exited with code {code}" for other, code in dead.items() if other != index]
    raise PipelineError(f"pipeline stage {index} failed: {detail.strip()}"
                        + (f"\n(then {'; '.join(others)})" if others else ""))


def _knock_on(detail: str) -> bool:
    """Whether a stage's error is the consequence of another's (a connection that closed or failed)."""
    return detail.startswith(("ConnectionError", "ConnectionResetError", "BrokenPipeError", "TimeoutError"))


def _reap(processes: list, grace_s: float = 10.0) -> None:
    """Wait a little for stages that are finishing, then kill the rest; join every one."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join(5)


def single_process_reference(config, *, micro_batches: int, micro_batch_size: int, steps: int, seed: int = 0,
                             lr: float = 1e-3, data_peer: str | int = "pipeline") -> tuple[list[float], Any]:
    """The same training in one process (for checks): the per-step losses and the trained model."""
    import torch

    from components.decentral.model import Corpus, ModelConfig, build_model, lm_loss

    if isinstance(config, str):
        config = ModelConfig.named(config)
    model = build_model(config, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    corpus = Corpus(seed, context=config.context)
    losses = []
    for step in range(steps):
        inputs, targets = corpus.batch(data_peer, step, micro_batches * micro_batch_size)
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, model
