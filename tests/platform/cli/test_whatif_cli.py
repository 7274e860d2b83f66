"""``strata quota what-if`` waits for a long replay once: one request with the replay's timeout, never retried."""

from __future__ import annotations

from types import SimpleNamespace

from strata.cli import whatif_cli

ANSWER = {"jobs": 3, "days": 7.0, "teams": [],
          "cluster": {"current": {"nodes": 2, "utilization": 0.5}, "proposed": {"nodes": 3, "utilization": 0.4}}}


class Recorder:
    def __init__(self):
        self.calls = []

    def post(self, path, json=None, **kwargs):
        self.calls.append((path, json, kwargs))
        return ANSWER


def args(**overrides):
    values = dict(days=7.0, what_if_team=None, max_gpus=None, weight=None, add_nodes=1, node_gpus=8,
                  remove_nodes=None, json=False, what_if_timeout=whatif_cli.REPLAY_TIMEOUT_S)
    values.update(overrides)
    return SimpleNamespace(**values)


def test_one_request_with_the_replay_timeout_and_no_retries(capsys):
    client = Recorder()
    assert whatif_cli.what_if(args(), client) == 0
    assert client.calls == [("quotas/what-if/", {"days": 7.0, "nodes": {"add": [{"count": 1, "gpus": 8}]}},
                             {"timeout": 900.0, "retries": 0})]
    captured = capsys.readouterr()
    assert "replaying the last 7 days" in captured.err and "3 jobs of the last 7 days replayed" in captured.out
    whatif_cli.what_if(args(what_if_timeout=5.0), client)
    assert client.calls[-1][2] == {"timeout": 5.0, "retries": 0}


def test_the_timeout_flag_is_parsed():
    from strata.cli.main import build_parser

    parsed = build_parser().parse_args(["quota", "what-if", "--add-nodes", "1", "--timeout", "42"])
    assert parsed.what_if_timeout == 42.0
