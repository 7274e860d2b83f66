"""`strata node` reads its token from --token, STRATA_NODE_TOKEN or a file named by STRATA_NODE_TOKEN_FILE (a
mounted secret), and says in one line what is missing."""

from __future__ import annotations

import os
import subprocess
import sys


def node(env: dict, tmp_path) -> subprocess.CompletedProcess:
    variables = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_NODE_TOKEN")}
    variables.update(env, STRATA_HOME=str(tmp_path))
    # Both cases stop before the agent contacts the (unused) server.
    return subprocess.run([sys.executable, "-m", "strata.cli.main", "node", "--server", "http://127.0.0.1:9",
                           "--virtual-gpus", "1", "--state-dir", str(tmp_path / "node")],
                          env=variables, capture_output=True, text=True,
                          timeout=120)


def test_no_token_is_one_clear_line(tmp_path):
    done = node({}, tmp_path)
    assert done.returncode != 0
    assert "a node token is required" in done.stderr and "STRATA_NODE_TOKEN_FILE" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreadable_token_file_is_named(tmp_path):
    done = node({"STRATA_NODE_TOKEN_FILE": str(tmp_path / "missing")}, tmp_path)
    assert done.returncode != 0 and "STRATA_NODE_TOKEN_FILE" in done.stderr and "missing" in done.stderr
    assert "Traceback" not in done.stderr
