"""CLI commands that talk to the control plane over REST: submit, jobs, logs, cancel, quota, token, secrets."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from components.runtime.client.client import ApiError, ControlPlaneClient
from strata.cli.config import client_settings

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def connect(args) -> ControlPlaneClient:
    """The REST client the CLI's flags, environment and config file describe."""
    url, token = client_settings(getattr(args, "url", None), getattr(args, "token", None))
    return ControlPlaneClient(url, token, retries=3)



def load_job_file(path: str) -> dict:
    source = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as error:
        # One line: PyYAML's own message spans several, with a source excerpt.
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or str(error).strip().splitlines()[0]
        raise ValueError(f"{path} is not valid YAML or JSON: {problem}{where}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping with at least 'kind' and 'spec'")
    return data


def _human(size: float) -> str:
    from components.runtime.shared.bundles import human_size

    return human_size(int(size))


def push_code(client: ControlPlaneClient, directory: str, team: str | None) -> str:
    """Pack ``directory`` (honouring .gitignore and .strataignore) and upload it; returns the bundle's digest.
    The same contents uploaded again by the team are the same bundle (nothing is stored twice)."""
    import tempfile

    from components.runtime.shared import bundles
    from strata.cli.config import ConfigError

    with tempfile.TemporaryFile() as archive:
        try:
            manifest, digest = bundles.pack(directory, archive, max_bytes=_code_limit())
        except bundles.BundleError as error:
            raise ConfigError(f"cannot ship {directory}: {error}") from None
        size = archive.tell()
        print(f"packed {directory}: {len(manifest.files)} files, {_human(manifest.size)} "
              f"({_human(size)} compressed), sha256:{digest[:12]}", flush=True)
        archive.seek(0)
        params = {"team": team} if team else {}
        response = client.request("POST", "code/", data=archive, params=params, timeout=600, raw=True,
                                  headers={"Content-Type": "application/gzip"})
    answer = response.json()
    print(f"code bundle {answer['digest'][:12]} " + ("uploaded" if response.status_code == 201 else
                                                     "already stored (same contents)"), flush=True)
    return answer["digest"]


def _code_limit() -> int:
    import os

    raw = os.environ.get("STRATA_MAX_CODE_BYTES", "")
    return int(raw) if raw.isdigit() else 100 * 2**20


def _ship_code(client: ControlPlaneClient, body: dict, args) -> None:
    """``--code DIR``, or the job file's ``code:`` naming a directory (relative to the file), becomes a bundle."""
    directory = getattr(args, "code", None)
    named = body.get("code")
    if directory is None and isinstance(named, str) and args.file != "-":
        candidate = Path(args.file).parent / named
        if candidate.is_dir():
            directory = str(candidate)
    if directory is not None:
        body["code"] = push_code(client, directory, body.get("team"))


def submit(args) -> int:
    client = connect(args)
    body = load_job_file(args.file)
    if args.team:
        body["team"] = args.team
    _ship_code(client, body, args)
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    job = client.post("jobs/", body, headers=headers)
    print(f"submitted job {job['id']} ({job['name']}): {job['state']}", flush=True)
    if not args.wait:
        return 0
    return wait_for_job(client, job["id"], timeout=args.timeout)


def code(args) -> int:
    client = connect(args)
    if args.code_command == "push":
        print(push_code(client, args.directory, args.team))
        return 0
    if args.code_command == "list":
        page = client.get("code/", params={"team": args.team} if args.team else {})
        rows = page.get("results", page) if isinstance(page, dict) else page
        print(f"{'DIGEST':14} {'TEAM':12} {'FILES':>6} {'SIZE':>10} {'JOBS':>5}  CREATED")
        for row in rows:
            print(f"{row['digest'][:12]:14} {row['team']:12} {row['file_count']:>6} {_human(row['expanded_size']):>10} "
                  f"{row['jobs']:>5}  {row['created_at'][:19]}")
        return 0
    bundle = client.get(f"code/{args.digest.removeprefix('sha256:')}/")
    print(f"sha256:{bundle['digest']}  team {bundle['team']}  {bundle['file_count']} files, "
          f"{_human(bundle['expanded_size'])}, used by {bundle['jobs']} job(s)")
    for entry in bundle["files"]:
        print(f"{entry['size']:>12}  {entry['path']}")
    return 0


DEFAULT_CHUNK_BYTES = 8 * 2**20


def _data_source(path: str, spool) -> tuple[str, str, object]:
    """(format, file name, a readable binary file) of what ``strata data upload`` sends: a directory packed as a
    canonical tar.gz with every file (ignore files are data too), or a file as it is."""
    import os

    from components.runtime.shared import bundles
    from strata.cli.config import ConfigError

    if os.path.isdir(path):
        try:
            manifest, _digest = bundles.pack(path, spool, max_bytes=2**62, max_files=1_000_000, ignore_files=False,
                                             compresslevel=1)
        except bundles.BundleError as error:
            raise ConfigError(f"cannot upload {path}: {error}") from None
        print(f"packed {path}: {len(manifest.files)} files, {_human(manifest.size)} "
              f"({_human(spool.tell())} compressed)", flush=True)
        spool.seek(0)
        return "archive", "", spool
    if not os.path.isfile(path):
        raise ConfigError(f"{path} is neither a file nor a directory")
    return "file", os.path.basename(path), open(path, "rb")  # noqa: SIM115 -- closed by the caller


def _data_direct(client: ControlPlaneClient, upload: dict, path: str, size: int, chunk_size: int,
                 missing: list[int]) -> None:
    """Send the ``missing`` chunks of a direct upload straight to the object store, each through a URL the
    control plane signs for it with the chunk's MD5 (``components.runtime.client.transfers.send_parts``)."""
    import time
    from pathlib import Path

    from components.runtime.client import transfers

    def sign(index: int, md5: str) -> str:
        return client.post(f"uploads/{upload['id']}/parts/", {"parts": [{"index": index, "md5": md5}]})["urls"][0]["url"]

    began, left = time.monotonic(), sum(min(chunk_size, size - index * chunk_size) for index in missing)
    print(f"uploading {_human(left)} in {len(missing)} chunk(s) straight to the object store", flush=True)
    try:
        transfers.send_parts(Path(path), missing, lambda index: (index * chunk_size,
                                                                 min(chunk_size, size - index * chunk_size)),
                             sign, progress=lambda line: print(line, flush=True))
    except transfers.TransferError as error:
        from strata.cli.config import ConfigError

        raise ConfigError(f"upload {upload['id']} did not finish: {error} (run the same command again to resume)") \
            from None
    seconds = max(time.monotonic() - began, 1e-6)
    print(f"uploaded {_human(left)} in {seconds:.1f} s ({_human(int(left / seconds))}/s); the server verifies it",
          flush=True)


def data_upload(client: ControlPlaneClient, name: str, path: str, *, team: str | None = None,
                chunk_size: int = DEFAULT_CHUNK_BYTES) -> dict:
    """Upload ``path`` (a file, or a directory) as the data set ``name``, in chunks each checked by the server.
    An interrupted upload of the same name and contents resumes: the server says which chunks it has."""
    import hashlib
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="strata-data-") as spool:
        fmt, file_name, source = _data_source(path, spool)
        with source:
            digest, size = hashlib.sha256(), 0
            while block := source.read(1 << 20):
                digest.update(block)
                size += len(block)
            body = {"name": name, "size": size, "sha256": digest.hexdigest(), "chunk_size": chunk_size,
                    "format": fmt, **({"file": file_name} if file_name else {}), **({"team": team} if team else {})}
            upload = client.post("uploads/", body)
            missing = list(upload["missing"])
            done = size - sum(min(chunk_size, size - index * chunk_size) for index in missing)
            if done:
                print(f"resuming upload {upload['id']}: {len(upload['received'])} of {upload['chunks']} chunks "
                      "already on the server", flush=True)
            if upload.get("direct"):
                _data_direct(client, upload, source.name, size, chunk_size, missing)
                missing = []
            shown = -1
            for index in missing:
                source.seek(index * chunk_size)
                chunk = source.read(chunk_size)
                client.request("PUT", f"uploads/{upload['id']}/chunks/{index}/", data=chunk, timeout=600,
                               headers={"Content-Type": "application/octet-stream",
                                        "Content-SHA256": hashlib.sha256(chunk).hexdigest()})
                done += len(chunk)
                percent = int(done * 100 / size)
                if percent >= shown + 5 or done == size:  # a line every 5% at most
                    shown = percent
                    print(f"uploaded {_human(done)} of {_human(size)} ({percent}%)", flush=True)
    created = client.post(f"uploads/{upload['id']}/complete/", timeout=3600)  # a direct one is read through once
    print(f"data set {created['name']}: {created['file_count']} files, {_human(created['expanded_size'])}, "
          f"sha256:{created['digest'][:12]}", flush=True)
    return created


def data(args) -> int:
    """``strata data upload|list|show|delete``: the team's uploaded data sets (jobs mount them with
    ``spec.data.mount``)."""
    from components.runtime.shared.units import parse_bytes

    client = connect(args)
    params = {"team": args.team} if getattr(args, "team", None) else {}
    if args.data_command == "upload":
        data_upload(client, args.name, args.path, team=args.team, chunk_size=parse_bytes(args.chunk_size))
        return 0
    if args.data_command == "list":
        page = client.get("data/", params=params)
        rows = page.get("results", page) if isinstance(page, dict) else page
        print(f"{'NAME':24} {'TEAM':12} {'FORMAT':8} {'FILES':>7} {'SIZE':>10} {'JOBS':>5}  CREATED")
        for row in rows:
            print(f"{row['name']:24} {row['team']:12} {row['format']:8} {row['file_count']:>7} "
                  f"{_human(row['expanded_size']):>10} {row['jobs']:>5}  {row['created_at'][:19]}")
        return 0
    if args.data_command == "delete":
        client.delete(f"data/{args.name}/", params=params)
        print(f"deleted data set {args.name}")
        return 0
    found = client.get(f"data/{args.name}/", params=params)
    print(f"{found['name']}  team {found['team']}  {found['format']}, {found['file_count']} files, "
          f"{_human(found['expanded_size'])}, sha256:{found['digest']}, mounted by {found['jobs']} unfinished job(s)")
    for entry in found["files"]:
        print(f"{entry['size']:>12}  {entry['path']}")
    return 0


MAX_SECRET_BYTES = 64 * 1024


def read_secret_value(stream=None) -> str:
    """A secret's value from stdin (never from the command line, where ``ps`` and the shell's history see it):
    everything up to the end, less one final newline (``echo VALUE |`` adds one)."""
    stream = stream if stream is not None else sys.stdin
    if stream.isatty():
        import getpass

        return getpass.getpass("value (not echoed): ")
    data = stream.buffer.read(MAX_SECRET_BYTES + 2) if hasattr(stream, "buffer") else stream.read().encode()
    if len(data) > MAX_SECRET_BYTES + 1:
        raise ValueError(f"the value on stdin is larger than {MAX_SECRET_BYTES // 1024} KiB")
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the value on stdin is not UTF-8 text") from None
    value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise ValueError("no value on stdin: pipe it in, e.g. echo -n VALUE | strata secrets set NAME")
    return value


def secrets(args) -> int:
    """``strata secrets set|list|delete``: the team's secrets (a job names the ones it gets in
    ``spec.environment.secrets``). Values go in through stdin and never come back out."""
    client = connect(args)
    params = {"team": args.team} if args.team else {}
    if args.secrets_command == "set":
        value = read_secret_value()
        answer = client.post("secrets/", {"name": args.name, "value": value, **params})
        print(f"secret {answer['name']} of team {answer['team']} set")
        return 0
    if args.secrets_command == "delete":
        client.delete(f"secrets/{args.name}/", params=params)
        print(f"deleted secret {args.name}")
        return 0
    rows, page = [], 1
    while True:
        answer = client.get("secrets/", params={**params, "page": page, "page_size": 500})
        rows += answer.get("results", []) if isinstance(answer, dict) else answer
        if not isinstance(answer, dict) or not answer.get("next"):
            break
        page += 1
    print(f"{'NAME':32} {'TEAM':16} {'SET BY':16} UPDATED")
    for row in rows:
        print(f"{row['name']:32} {row['team']:16} {row['updated_by'] or '-':16} {row['updated_at'][:19]}")
    return 0


ENV_CHECK = ("import sys, importlib.metadata as m; print('python', sys.version.split()[0]); "
             "[print('installed', d.metadata['Name'], d.version) for d in "
             "sorted(m.distributions(path=[p for p in sys.path if p.startswith(sys.prefix)]), "
             "key=lambda d: str(d.metadata['Name']).lower())]")


def env_build(args) -> int:
    """Build the environment of a job file on a node: a CPU job that only imports nothing and lists what the
    environment installed. Exits 0 when the build succeeded; the build's log is the job's log."""
    client = connect(args)
    source = load_job_file(args.file)
    environment = (source.get("spec") or {}).get("environment")
    if not environment:
        raise ValueError(f"{args.file} has no spec.environment to build")
    if not source.get("kind"):
        raise ValueError(f"{args.file} names no kind")
    body = {"kind": source["kind"], "name": f"env-build-{Path(args.file).stem}"[:200],
            "resources": {"gpus": 0, "cpus": 1}, "max_attempts": 1,
            "spec": {"command": ["python", "-c", ENV_CHECK], "environment": environment}}
    if args.team or source.get("team"):
        body["team"] = args.team or source.get("team")
    if source.get("code") is not None:
        body["code"] = source["code"]
    _ship_code(client, body, args)
    job = client.post("jobs/", body)
    print(f"building the environment in job {job['id']}", flush=True)
    code = wait_for_job(client, job["id"], timeout=args.timeout)
    after = 0
    while lines := client.get(f"jobs/{job['id']}/logs/", params={"after": after}):
        for line in lines:
            message = line.get("message", "")
            if message.startswith(("[env]", "environment", "installed ", "python ", "building")):
                print(message)
        after = lines[-1]["id"]
    return code


def _progress(kind: str):
    """``(route, Progress)`` of the job route giving ``kind``'s jobs a live table, else None (a kind or plugin
    this client does not know shows no table)."""
    from components.runtime.contract import registry

    try:
        return registry.progress_route(kind)
    except Exception:  # noqa: BLE001 - a registry this client cannot load: states and metrics only
        return None


def _print_state(job: dict, started: float) -> str:
    reason = f" ({job['reason']})" if job["reason"] else ""
    print(f"[{time.monotonic() - started:6.1f}s] {job['state']}{reason}", flush=True)
    return job["state"]


def wait_for_job(client: ControlPlaneClient, job_id: str, timeout: float | None = None) -> int:
    started = time.monotonic()
    last_state, last_step, after = None, None, 0
    table, header_shown, rows = None, False, {}
    last_estimate = None
    while True:
        # The state, then everything reported up to it. An end state is printed after them: a job's points and
        # rows are all stored before it ends, so its end state is the last line.
        job = client.get(f"jobs/{job_id}/")
        if table is None:
            table = _progress(job["kind"]) or False
        if job["state"] != last_state and job["state"] not in TERMINAL:
            last_state = _print_state(job, started)
        if job.get("eta") and job["state"] in {"PENDING", "QUEUED"}:  # the start-time estimate, when it changes
            from strata.cli.eta_text import sentence

            eta = job["eta"]
            # Changed: another expected start (to the minute), interval, reason or remedy; not just time passing.
            key = json.dumps([(eta.get(k) or "")[:16] for k in ("start", "low", "high")]
                             + [eta.get("waits_for"), eta.get("run_now")], sort_keys=True)
            if key != last_estimate:
                print(f"[{time.monotonic() - started:6.1f}s] {sentence(eta)}", flush=True)
                last_estimate = key
        for _ in range(10_000 if job["state"] in TERMINAL else 20):  # drain the new points, a page per answer
            points = client.get(f"jobs/{job_id}/metrics/", params={"after": after})
            if not points:
                break
            after = points[-1]["id"]
            step = max(p["step"] for p in points)
            if step != last_step:
                latest = {p["name"]: p["value"] for p in points if p["step"] == step}
                shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(latest.items()))
                print(f"[{time.monotonic() - started:6.1f}s]   step {step}: {shown}", flush=True)
                last_step = step
        if table:  # the kind's live table: print each row when it changes
            try:
                route, progress = table
                header, current = progress.rows(client.get(f"jobs/{job_id}/{route}/"))
            except Exception:  # noqa: BLE001 - the table is a courtesy: a failed poll is retried next second
                header, current = "", []
            for key, text in current:
                if rows.get(key) != text:
                    if not header_shown and header:
                        print(f"{'':10} {header}", flush=True)
                        header_shown = True
                    print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)
                    rows[key] = text
        if job["state"] != last_state:
            last_state = _print_state(job, started)
        if job.get("endpoint"):  # a job with an endpoint runs until cancelled: waiting ends once it answers
            print(f"listening on {job['endpoint']} (strata cancel {job_id} to stop)", flush=True)
            return 0
        if job["state"] in TERMINAL:
            return 0 if job["state"] == "SUCCEEDED" else 1
        if timeout and time.monotonic() - started > timeout:
            print(f"strata: error: job {job_id} did not finish within {timeout:g} s (still {job['state']})",
                  file=sys.stderr)
            return 1
        time.sleep(1.0)


def jobs(args) -> int:
    params = {k: v for k, v in {"state": args.state, "kind": args.kind, "team": args.team}.items() if v}
    page = connect(args).get("jobs/", params={**params, "page_size": args.limit})
    if args.json:
        print(json.dumps(page["results"], indent=2))
        return 0
    print(job_table(page["results"]))
    return 0


def job_table(jobs: list[dict]) -> str:
    """``strata jobs``' table: columns as wide as their longest value (a kind, a team, a name: never cut,
    except names past 40 characters and reasons past 60), so the table lines up without truncating kinds."""
    columns = [("ID", "id", 36), ("NAME", "name", 40), ("KIND", "kind", None), ("TEAM", "team", None),
               ("STATE", "state", None), ("HOLDS", "holds", None), ("START", "start", None)]
    from strata.cli.eta_text import short

    rows = [{**job, "holds": _holds(job.get("resources") or {}), "start": short(job)} for job in jobs]
    widths = {}
    for title, key, limit in columns:
        widest = max([len(title), *(len(str(row.get(key) or "")) for row in rows)])
        widths[key] = min(widest, limit) if limit else widest
    lines = ["  ".join(f"{title:{widths[key]}}" for title, key, _ in columns) + "  REASON"]
    for row in rows:
        cells = [f"{str(row.get(key) or '')[:widths[key]]:{widths[key]}}" for _, key, _ in columns]
        lines.append("  ".join(cells) + f"  {(row.get('reason') or '')[:60]}")
    return "\n".join(line.rstrip() for line in lines)


def _holds(resources: dict) -> str:
    """A job's resources in a few characters: GPUs per worker (a job with none: its CPUs), × workers."""
    gpus = float(resources.get("gpus") or 0)
    text = f"{gpus:g} GPU"
    if gpus <= 0 and not resources.get("gpu_memory") and resources.get("cpus"):
        text = f"{float(resources['cpus']):g} CPU"
    workers = int(resources.get("workers") or 1)
    return f"{text} ×{workers}" if workers > 1 else text


def logs(args) -> int:
    """A job's lines, oldest first (``-f`` follows), with the trimming notice on stderr; the filters and the team's
    search (--grep/--search/--since/--until/--rank: strata.jobs.log_search) go the same way."""
    from strata.cli import log_commands

    return log_commands.logs(args, connect(args))


def artifacts(args) -> int:
    """List a job's artifacts, or download some (``--all``: every one) into ``--output``. A download follows the
    API's redirect to a presigned URL of the object store (without the API token) where the cluster has one."""
    client = connect(args)
    rows = client.get(f"jobs/{args.job}/artifacts/")
    wanted = [row for row in rows if args.all or row["name"] in args.names]
    if not args.all and not args.names:
        print(f"{'NAME':32} {'SIZE':>10}  SHA256")
        for row in rows:
            print(f"{row['name']:32} {_human(row['size']):>10}  {row['sha256'][:12]}")
        return 0
    missing = sorted(set(args.names) - {row["name"] for row in rows})
    if missing:
        print(f"error: job {args.job} has no artifact {', '.join(missing)}", file=sys.stderr)
        return 1
    import hashlib

    directory = Path(args.output)
    directory.mkdir(parents=True, exist_ok=True)
    for row in wanted:
        target = directory / Path(row["name"]).name
        response = client.request("GET", f"jobs/{args.job}/artifacts/{row['id']}/download/", raw=True, stream=True,
                                  timeout=3600)
        digest = hashlib.sha256()
        with response, target.open("wb") as out:
            for chunk in response.iter_content(1 << 20):
                out.write(chunk)
                digest.update(chunk)
        if digest.hexdigest() != row["sha256"]:
            target.unlink(missing_ok=True)
            print(f"error: {row['name']}: the downloaded bytes do not match its SHA-256", file=sys.stderr)
            return 1
        print(f"{target}: {_human(row['size'])}, sha256 {row['sha256'][:12]} checked")
    return 0


def cancel(args) -> int:
    job = connect(args).post(f"jobs/{args.job}/cancel/")
    print(f"job {job['id']}: {job['state']}")
    return 0


def plugins(args) -> int:
    """``strata plugins``: the installed plugins (this machine's registry), each with its version, the plugins it
    requires and what it contributes."""
    from components.runtime.contract import registry
    from components.runtime.contract.plugins import SEAMS

    for name, loaded in sorted(registry.plugins().items()):
        parts = [f"requires: {', '.join(loaded.plugin.requires)}"] if loaded.plugin.requires else []
        for row in SEAMS:  # every seam the plugin uses: named parts by name, the others by class or function
            value = getattr(loaded.plugin, row.name)
            if not value:
                continue
            if row.shape == "path":
                shown = [value.rpartition(":")[2]]
            elif row.shape == "mapping" or row.combine == "by name":
                shown = sorted(loaded.parts[row.name])
            else:
                shown = [path.rpartition(":")[2] for path in value]
            parts.append(f"{row.name.replace('_', ' ')}: {', '.join(shown)}")
        print(f"{name:12} {loaded.plugin.version:8} {'; '.join(parts) or '(nothing)'}")
    for name, problem in sorted(registry.problems().items()):
        print(f"{name:12} LEFT OUT: {problem}")
    return 0


def _parse_assignments(pairs: list[str]) -> dict:
    changes = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects field=value, got {pair!r}")
        changes[name] = None if value.lower() in {"", "none", "null", "unlimited"} else yaml.safe_load(value)
    return changes


def _data_roots(value) -> list:
    """``--set data_roots=...``: a YAML list ([/srv/a, /srv/b]), or paths separated by commas; none: no roots."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value  # the server names what is wrong with anything else


def quota(args) -> int:
    client = connect(args)
    if args.team == "what-if":
        from strata.cli.whatif_cli import what_if

        return what_if(args, client)
    if args.set:
        if not args.team:
            raise ValueError("--set needs a team: strata quota TEAM --set max_gpus=4")
        changes = _parse_assignments(args.set)
        if "data_roots" in changes:
            changes["data_roots"] = _data_roots(changes["data_roots"])
        client.request("PATCH", f"quotas/{args.team}/", json=changes)
    teams = [args.team] if args.team else [q["team"] for q in client.get("quotas/")["results"]]
    for team in teams:
        answer = client.get(f"quotas/{team}/usage/")
        quota, usage = answer["quota"], answer["usage"]
        print(f"team {team}")
        for field, used in (("max_concurrent_jobs", usage["jobs"]), ("max_gpus", usage["gpus"]),
                            ("max_gpu_memory", usage["gpu_memory"]), ("gpu_hours", usage["gpu_hours_window"]),
                            ("max_cpus", usage.get("cpus", 0.0)), ("max_memory", usage.get("memory", 0))):
            limit = quota[field]
            print(f"  {field:20} {used:>10.4g} / {'unlimited' if limit is None else limit}")
        if usage.get("cpu_hours_total"):
            print(f"  {'cpu_hours':20} {usage['cpu_hours_window']:>10.4g} in the last {quota['window_hours']:g} h")
        print(f"  {'priority':20} {quota['priority']:>10}   weight {quota['weight']:g}   pending {usage['pending']}")
        roots = quota.get("data_roots") or []
        print(f"  {'data_roots':20} {', '.join(roots) if roots else 'none (no data may be registered by path)'}")
    return 0


def token_create(args) -> int:
    body = {"name": args.name or "", "kind": args.kind}
    if args.team:
        body["team"] = args.team
    if args.ttl_days:
        body["ttl_days"] = args.ttl_days
    answer = connect(args).post("tokens/", body)
    print(answer["token"])
    print(f"({answer['kind']} token {answer['prefix']}, expires {answer['expires_at']}; shown only once)",
          file=sys.stderr)
    return 0


def job_token(args) -> int:
    """``strata job-token create|list|revoke``: a job's access tokens."""
    api = connect(args)
    if args.job_token_command == "create":
        body = {"name": args.name}
        if args.expires_in:
            body["expires_in_s"] = args.expires_in
        answer = api.post(f"jobs/{args.job}/tokens/", body)
        print(answer["token"])
        expires = f"expires {answer['expires_at']}" if answer["expires_at"] else "works until revoked"
        print(f"(token {answer['id']} {answer['prefix']}…, {expires}; shown only once)", file=sys.stderr)
    elif args.job_token_command == "list":
        for token in api.get(f"jobs/{args.job}/tokens/"):
            state = "active" if token["active"] else ("revoked" if token["revoked_at"] else "expired")
            print(f"{token['id']}  {token['prefix']}…  {state:8s}  {token['name'] or '-'}  "
                  f"created {token['created_at']} by {token['created_by'] or '-'}"
                  + (f", expires {token['expires_at']}" if token["expires_at"] else ""))
    else:
        answer = api.delete(f"jobs/{args.job}/tokens/{args.token_id}/")
        print(f"token {answer['id']} ({answer['prefix']}…) revoked")
    return 0


def _ago(stamp: str | None) -> str:
    from datetime import datetime

    if not stamp:
        return "-"
    try:
        seconds = (datetime.now().astimezone() - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return stamp
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def participants(args) -> int:
    """``strata participants JOB``: the machines outside the cluster that joined the job, one line each."""
    found = connect(args).get(f"jobs/{args.job}/participants/")
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print(f"job {args.job} has no participants")
        return 0
    for item in found:
        metrics = " ".join(f"{name}={value:.4g}" for name, value in sorted(item["metrics"].items())[:6])
        print(f"{item['id']}  {item['name'][:24]:24} {item['state']:8} gpus {item['gpus']:<5g} "
              f"seen {_ago(item['last_seen']):8} {item['reason'] or metrics}".rstrip())
    return 0


__all__ = ["ApiError", "connect", "submit", "jobs", "logs", "cancel", "quota", "plugins", "token_create", "job_token",
           "participants", "wait_for_job"]
