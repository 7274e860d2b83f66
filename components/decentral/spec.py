"""The ``decentralized-train`` job kind (light: the control plane imports it).

A swarm of peers trains one model (Atom on hivemind). ``resources.workers`` peers start on cluster nodes (each a
rank of the attempt, each with ``resources.gpus``); collaborators add their own machines with
``strata peer join JOB_ID --token T`` (a job access token), up to ``peers.max`` in all. Losing a peer is normal:
the ranks are independent (``elastic_ranks``), and a lost node's peers are not retried (see ``hooks.py``)::

    kind: decentralized-train
    resources: {workers: 3, gpus: 0}
    spec:
      model: small            # tiny | small | medium | large (train's TinyGPT, char-level, bundled corpus)
      steps: 300              # local optimizer steps per peer
      batch_size: 16
      lr: 0.003
      seed: 0
      peers: {min: 2, max: 16}            # averaging needs min peers; at most max in the swarm
      averaging: {period_s: 5, max_update_ratio: 10}
      swap: {budget_mb: null, pcie_gbps: 16}   # Atom layer swapping under a device-memory budget
      eval_every: 25
      target_loss: null       # stop when the held-out loss reaches it
      faults: {corrupt: {ranks: [2], mode: nan}}   # tests and demos: hostile peers
"""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.spec import Checker, KindSpec, SpecError

KIND = "decentralized-train"
PLUGIN = "decentral"
MODEL_SIZES = ("tiny", "small", "medium", "large")
CORRUPT_MODES = ("nan", "scale")
TOP_LEVEL = {"model", "steps", "batch_size", "lr", "seed", "peers", "averaging", "swap", "eval_every",
             "target_loss", "threads", "faults"}


def _section(spec: dict[str, Any], name: str, checker: Checker) -> dict[str, Any]:
    value = spec.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        checker.errors[f"spec.{name}"] = "must be an object"
        return {}
    return value


class DecentralizedTrainSpec(KindSpec):
    kind: ClassVar[str] = KIND
    component: ClassVar[str] = "components.decentral.component:DecentralComponent"
    description: ClassVar[str] = ("Decentralized training on hivemind (Atom): peers on cluster nodes and volunteers' "
                                  "machines average their models asynchronously; layers swap in from host memory.")
    accepts_tokens: ClassVar[bool] = True  # volunteers join with the job's access tokens
    accepts_participants: ClassVar[bool] = True
    elastic_ranks: ClassVar[bool] = True
    # A swarm gives up peers rather than stopping when a higher-priority job needs room (down to two, so that it
    # still averages): rank 0 checkpoints at the stop and the swarm resumes from it with fewer peers.
    elastic: ClassVar[dict[str, float] | None] = {"min_workers": 2}

    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(spec, dict):
            raise SpecError({"spec": "must be an object"})
        checker = Checker(spec)
        checker.unknown(TOP_LEVEL)
        checker.not_null("model", "steps", "batch_size", "lr", "seed", "eval_every", "threads")
        out: dict[str, Any] = {
            "model": checker.string("model", "small", choices=MODEL_SIZES),
            "steps": checker.number("steps", 300, kind=int, minimum=1, maximum=10_000_000),
            "batch_size": checker.number("batch_size", 16, kind=int, minimum=1, maximum=4096),
            "lr": checker.number("lr", 3e-3, minimum=1e-7, maximum=10.0),
            "seed": checker.number("seed", 0, kind=int, minimum=0, maximum=2**31 - 1),
            "eval_every": checker.number("eval_every", 25, kind=int, minimum=1, maximum=1_000_000),
            "threads": checker.number("threads", 1, kind=int, minimum=1, maximum=64),
        }
        target = spec.get("target_loss")
        out["target_loss"] = None if target is None else checker.number("target_loss", None, minimum=0.0,
                                                                        maximum=100.0)
        peers = Checker(_section(spec, "peers", checker), "spec.peers")
        peers.unknown({"min", "max"})
        out["peers"] = {"min": peers.number("min", 2, kind=int, minimum=1, maximum=1024),
                        "max": peers.number("max", 16, kind=int, minimum=1, maximum=1024)}
        peers.not_null("min", "max")
        if not peers.errors and out["peers"]["min"] > out["peers"]["max"]:
            peers.errors["spec.peers.min"] = f"must be at most peers.max ({out['peers']['max']})"
        averaging = Checker(_section(spec, "averaging", checker), "spec.averaging")
        averaging.unknown({"period_s", "max_update_ratio"})
        out["averaging"] = {"period_s": averaging.number("period_s", 5.0, minimum=0.5, maximum=3600.0),
                            "max_update_ratio": averaging.number("max_update_ratio", 10.0, minimum=1.0,
                                                                 maximum=1e6)}
        averaging.not_null("period_s", "max_update_ratio")
        swap = Checker(_section(spec, "swap", checker), "spec.swap")
        swap.unknown({"budget_mb", "pcie_gbps"})
        budget = (spec.get("swap") or {}).get("budget_mb") if isinstance(spec.get("swap"), dict) else None
        out["swap"] = {"budget_mb": None if budget is None else swap.number("budget_mb", None, minimum=0.01,
                                                                            maximum=1e7),
                       "pcie_gbps": swap.number("pcie_gbps", 16.0, minimum=0.01, maximum=10_000.0)}
        swap.not_null("pcie_gbps")
        faults = Checker(_section(spec, "faults", checker), "spec.faults")
        faults.unknown({"corrupt"})
        out["faults"] = {"corrupt": None}
        corrupt_value = (spec.get("faults") or {}).get("corrupt") if isinstance(spec.get("faults"), dict) else None
        if corrupt_value is not None:
            if not isinstance(corrupt_value, dict):
                faults.errors["spec.faults.corrupt"] = "must be an object"
            else:
                corrupt = Checker(corrupt_value, "spec.faults.corrupt")
                corrupt.unknown({"ranks", "mode", "factor"})
                ranks = corrupt_value.get("ranks", [])
                if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool)
                                                          and 0 <= r < 1024 for r in ranks):
                    corrupt.errors["spec.faults.corrupt.ranks"] = "must be a list of ranks (0..1023)"
                    ranks = []
                out["faults"]["corrupt"] = {"ranks": sorted(set(ranks)),
                                            "mode": corrupt.string("mode", "nan", choices=CORRUPT_MODES),
                                            "factor": corrupt.number("factor", 1e6, minimum=-1e12, maximum=1e12)}
                corrupt.not_null("mode", "factor")
                checker.errors.update(corrupt.errors)
        for part in (peers, averaging, swap, faults):
            checker.errors.update(part.errors)
        checker.raise_if_errors()
        return out

    def resource_problems(self, spec: dict[str, Any], resources: dict[str, Any]) -> dict[str, str]:
        workers = int(resources.get("workers", 1))
        if workers > spec["peers"]["max"]:
            return {"resources.workers": f"{workers} peers on cluster nodes is more than spec.peers.max "
                                         f"({spec['peers']['max']})"}
        return {}

    def participant_payload(self, spec: dict[str, Any], data) -> dict[str, Any]:
        """What a volunteer needs to join: the swarm's initial peers (every live peer's addresses, from the
        latest swarm report) and the peer count."""
        from components.decentral.panels import latest_swarm

        report = latest_swarm(data) or {}
        addresses: list[str] = []
        for peer in report.get("peers") or []:
            for address in peer.get("maddrs") or []:
                if address not in addresses:
                    addresses.append(address)
        for address in report.get("maddrs") or []:
            if address not in addresses:
                addresses.insert(0, address)
        return {"initial_peers": addresses[:16], "peers": len(report.get("peers") or []),
                "max_peers": spec["peers"]["max"]}

    def json_schema(self) -> dict[str, Any]:
        number = {"type": "number"}
        return {
            "type": "object", "additionalProperties": False,
            "properties": {
                "model": {"type": "string", "enum": list(MODEL_SIZES), "default": "small",
                          "description": "Model size (train's TinyGPT on the bundled corpus)."},
                "steps": {"type": "integer", "minimum": 1, "maximum": 10_000_000, "default": 300,
                          "description": "Local optimizer steps per peer."},
                "batch_size": {"type": "integer", "minimum": 1, "maximum": 4096, "default": 16},
                "lr": {**number, "minimum": 1e-7, "maximum": 10.0, "default": 3e-3},
                "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "default": 0},
                "eval_every": {"type": "integer", "minimum": 1, "maximum": 1_000_000, "default": 25},
                "threads": {"type": "integer", "minimum": 1, "maximum": 64, "default": 1},
                "target_loss": {"type": ["number", "null"], "minimum": 0, "maximum": 100, "default": None},
                "peers": {"type": "object", "additionalProperties": False, "properties": {
                    "min": {"type": "integer", "minimum": 1, "maximum": 1024, "default": 2},
                    "max": {"type": "integer", "minimum": 1, "maximum": 1024, "default": 16}}},
                "averaging": {"type": "object", "additionalProperties": False, "properties": {
                    "period_s": {**number, "minimum": 0.5, "maximum": 3600, "default": 5.0},
                    "max_update_ratio": {**number, "minimum": 1, "maximum": 1e6, "default": 10.0}}},
                "swap": {"type": "object", "additionalProperties": False, "properties": {
                    "budget_mb": {"type": ["number", "null"], "minimum": 0.01, "maximum": 1e7, "default": None},
                    "pcie_gbps": {**number, "minimum": 0.01, "maximum": 10_000, "default": 16.0}}},
                "faults": {"type": "object", "additionalProperties": False, "properties": {
                    "corrupt": {"type": ["object", "null"], "additionalProperties": False, "properties": {
                        "ranks": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1023}},
                        "mode": {"type": "string", "enum": list(CORRUPT_MODES)},
                        "factor": {**number, "minimum": -1e12, "maximum": 1e12}}}}},
            },
        }
