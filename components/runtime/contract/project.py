"""A team's own project, as a spec says it: the command, the environment (requirements, pip, python path,
variables, secrets), the report lines a command prints, and which claims run a team's code.

Light (standard library only): the control plane checks specs with it; the node's side (the caches, the
environments and the attempt's working directory) is :mod:`components.runtime.node.project_cache`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MAX_COMMAND_ARGS = 1000
MAX_COMMAND_BYTES = 65_536
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by Strata for every command job; a job's environment cannot override them.
RESERVED_ENV = re.compile(r"^(STRATA_.*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|"
                          r"MASTER_ADDR|MASTER_PORT|CUDA_VISIBLE_DEVICES|PYTHONPATH)$")
ENVIRONMENT_FIELDS = {"requirements", "pip", "python_path", "env", "secrets"}
# Team secrets (``environment.secrets``: names of the team's secrets, given to the job as environment variables):
# upper-case names, never one the runtime, the loader or the interpreter reads for itself.
SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
RESERVED_SECRET = re.compile(
    r"^(STRATA_.*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|MASTER_ADDR|MASTER_PORT|"
    r"CUDA_VISIBLE_DEVICES|PATH|HOME|TMPDIR|PWD|USER|LOGNAME|SHELL|IFS|ENV|BASH_ENV|_|VIRTUAL_ENV|PYTHON.*|LD_.*|"
    r"OMP_NUM_THREADS|GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME|PYTORCH_CUDA_ALLOC_CONF|TORCHELASTIC_.*)$")
MAX_JOB_SECRETS = 64
MAX_PIP_SPECS = 200


# -- the spec: checked by the control plane --------------------------------------------------------------------
def command_errors(command: Any, name: str = "spec.command") -> dict[str, str]:
    """Problems of a ``command`` (a non-empty list of strings), keyed by field."""
    if command is None:
        return {}
    if not isinstance(command, list) or not command:
        return {name: "must be a non-empty list of strings, e.g. [\"python\", \"main.py\"]"}
    if len(command) > MAX_COMMAND_ARGS:
        return {name: f"must have at most {MAX_COMMAND_ARGS} arguments"}
    bad = [i for i, arg in enumerate(command) if not isinstance(arg, str | int | float) or isinstance(arg, bool)]
    if bad:
        return {name: f"must hold strings (or numbers) only (item {bad[0]} is {type(command[bad[0]]).__name__})"}
    command = normalize_command(command)
    if not command[0].strip():
        return {name: "the program (the first item) must not be empty"}
    if sum(len(arg.encode("utf-8", "surrogatepass")) for arg in command) > MAX_COMMAND_BYTES:
        return {name: f"must be at most {MAX_COMMAND_BYTES} bytes in all"}
    if any("\x00" in arg for arg in command):
        return {name: "must not contain NUL characters"}
    return {}


def normalize_command(command: list[Any]) -> list[str]:
    """The command as strings: a number (``--epochs 3`` written in YAML, a sweep's ``{{lr}}``) as its text."""
    return [arg if isinstance(arg, str) else str(arg) for arg in command]


def _relative_file(value: Any) -> str | None:
    """A relative path inside the bundle, or None when it is not one."""
    if not isinstance(value, str) or not value.strip() or len(value) > 1024 or "\x00" in value:
        return None
    parts = Path(value).parts
    if Path(value).is_absolute() or ".." in parts:
        return None
    return value


def secret_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a team secret (None when it can)."""
    if not isinstance(name, str) or not SECRET_NAME.match(name):
        return "must be 1 to 64 upper-case letters, digits and underscores, not starting with a digit (e.g. HF_TOKEN)"
    if RESERVED_SECRET.match(name):
        return "is set by Strata, the loader or Python itself and cannot be a secret's name"
    return None


def secrets_errors(secrets: Any, name: str = "spec.environment.secrets") -> dict[str, str]:
    """Problems of an ``environment.secrets`` list (names of the team's secrets), keyed by field."""
    if secrets is None:
        return {}
    if not isinstance(secrets, list):
        return {name: "must be a list of the team's secret names, e.g. [\"HF_TOKEN\"]"}
    if len(secrets) > MAX_JOB_SECRETS:
        return {name: f"must name at most {MAX_JOB_SECRETS} secrets"}
    for item in secrets:
        if problem := secret_name_problem(item):
            return {name: f"{repr(item)[:70]} {problem}"}
    return {}


def requested_secrets(spec: Any) -> list[str]:
    """The secret names a (checked) spec asks for, in order, each once; [] when none or not a list of names."""
    environment = spec.get("environment") if isinstance(spec, dict) else None
    names = environment.get("secrets") if isinstance(environment, dict) else None
    if not isinstance(names, list):
        return []
    return list(dict.fromkeys(name for name in names if isinstance(name, str)))


def environment_errors(environment: Any, name: str = "spec.environment") -> dict[str, str]:
    """Problems of an ``environment`` (``{requirements, pip, python_path, env, secrets}``), every field at once."""
    if environment is None:
        return {}
    if not isinstance(environment, dict):
        return {name: "must be an object: {requirements: FILE, pip: [specs], python_path: [dirs], env: {NAME: value}, "
                      "secrets: [NAME]}"}
    errors = {}
    for key in environment:
        if key not in ENVIRONMENT_FIELDS:
            errors[f"{name}.{str(key)[:64]}"] = f"unknown field; allowed: {', '.join(sorted(ENVIRONMENT_FIELDS))}"
    requirements = environment.get("requirements")
    if requirements is not None and _relative_file(requirements) is None:
        errors[f"{name}.requirements"] = "must be a relative path to a file in the code bundle, e.g. requirements.txt"
    pip = environment.get("pip")
    if pip is not None:
        if not isinstance(pip, list) or not all(isinstance(p, str) and p.strip() and len(p) <= 500 for p in pip):
            errors[f"{name}.pip"] = "must be a list of package specifications, e.g. [\"tqdm==4.66.4\"]"
        elif len(pip) > MAX_PIP_SPECS:
            errors[f"{name}.pip"] = f"must name at most {MAX_PIP_SPECS} packages"
        elif any(p.strip().startswith("-") for p in pip):
            errors[f"{name}.pip"] = "options are not accepted, only package specifications"
    python_path = environment.get("python_path")
    if python_path is not None and (not isinstance(python_path, list)
                                    or not all(_relative_file(p) is not None for p in python_path)
                                    or len(python_path) > 64):
        errors[f"{name}.python_path"] = "must be a list of relative directories in the code bundle, e.g. [\"src\"]"
    env = environment.get("env")
    if env is not None:
        if not isinstance(env, dict) or len(env) > 256:
            errors[f"{name}.env"] = "must be an object of at most 256 NAME: value pairs"
        else:
            for key, value in env.items():
                label = f"{name}.env.{str(key)[:64]}"
                if not isinstance(key, str) or not ENV_NAME.match(key):
                    errors[label] = "is not a valid variable name"
                elif RESERVED_ENV.match(key):
                    errors[label] = "is set by Strata and cannot be overridden"
                elif not isinstance(value, str | int | float) or isinstance(value, bool) or "\x00" in str(value) \
                        or len(str(value)) > 32_768:
                    errors[label] = "must be a string or a number (at most 32 KiB)"
    secret_problems = secrets_errors(environment.get("secrets"), f"{name}.secrets")
    errors.update(secret_problems)
    if not secret_problems and isinstance(env, dict):
        both = sorted(set(requested_secrets({"environment": environment})) & {str(key) for key in env})
        if both:
            errors[f"{name}.secrets"] = f"{', '.join(both)} also set in {name}.env: name each variable once"
    return errors


def normalize_environment(environment: dict[str, Any] | None) -> dict[str, Any] | None:
    if not environment:
        return None
    normalized = {"requirements": environment.get("requirements"), "pip": list(environment.get("pip") or []),
                  "python_path": list(environment.get("python_path") or []),
                  "env": {k: str(v) for k, v in (environment.get("env") or {}).items()}}
    if secrets := requested_secrets({"environment": environment}):
        normalized["secrets"] = secrets  # names only: the values come with the attempt's claim
    return normalized


def needs_build(environment: dict[str, Any] | None) -> bool:
    return bool(environment and (environment.get("requirements") or environment.get("pip")))


# -- what a command reports on stdout ----------------------------------------------------------------------------
REPORT_LINE = re.compile(r"^\s*strata:\s*(.*)$")
PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_./-]{0,99})=(\S+)")


def parse_report(line: str) -> tuple[dict[str, float], int | None] | None:
    """``strata: a=1 b=2 step=3`` as ({"a": 1.0, "b": 2.0}, 3); None when the line is not a report (the shape
    Katib's stdout collector reads; ``strata_report.report`` prints it outside Strata)."""
    match = REPORT_LINE.match(line)
    if not match:
        return None
    values: dict[str, float] = {}
    step = None
    for name, text in PAIR.findall(match.group(1)):
        try:
            number = float(text)
        except ValueError:
            continue
        if name == "step":
            step = int(number)
        else:
            values[name] = number
    if not values and step is None:
        return None
    return values, step


# -- errors that retrying cannot fix ----------------------------------------------------------------------------
class UserError(RuntimeError):
    """A deterministic error of the job itself (a failed environment build, a missing file, a command that does
    not exist, an import error): the attempt fails once with this message and the job is not retried."""




def project_of(claim: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(code, environment) of a claim: the bundle ``{"digest", "size"}`` and the spec's environment, or None."""
    spec = claim.get("spec") or {}
    return claim.get("code") or None, normalize_environment(spec.get("environment"))


def uses_project(claim: dict[str, Any]) -> bool:
    from components.runtime.contract.data import mounts_of

    code, environment = project_of(claim)
    spec = claim.get("spec") or {}
    return bool(code or environment or spec.get("command") or mounts_of(spec))


def reads_data_sets(claim: dict[str, Any]) -> bool:
    """Whether the attempt reads uploaded data sets the node must fetch first (mounted, or named by a data
    provider's options). Data a data provider reads makes no attempt run the team's code: a built-in workload
    over an uploaded data set may still be hosted."""
    from components.runtime.contract.data import data_sets_of

    return bool(data_sets_of(claim.get("spec")))


def runs_user_code(claim: dict[str, Any]) -> bool:
    """Whether the attempt runs a team's own code: its project (:func:`uses_project`), an entry point it named
    (``spec.entrypoint``), or what a team's code wrote (the control plane's ``reads_user_output``: it reads a
    source job's artifacts, such as an exported model program, that such code produced). Such an attempt runs in
    its own processes, in the node's sandbox (:mod:`components.runtime.node.sandbox`), never inside a node service
    shared with other teams' attempts."""
    return (uses_project(claim) or bool((claim.get("spec") or {}).get("entrypoint"))
            or bool(claim.get("reads_user_output")))
