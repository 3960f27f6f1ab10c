"""The calls of workers, best-of-N, dev servers and the PR view without a
server: what each sends over gRPC and REST (routes, bodies without the path's
fields, the logs query), and how their REST/SSE JSON is read (enums by their
JSON names inside workers, events and launch configs)."""

from __future__ import annotations

import pytest

from vak_client import VakError, agent_pb2, json_name
from vak_client._common import parse_json
from vak_client._workbench import (
    call_discard_candidate,
    call_get_pr,
    call_keep_candidate,
    call_launch_logs,
    call_list_launch,
    call_list_workers,
    call_merge_pr,
    call_start_best_of_n,
    call_start_launch,
    call_steer_worker,
    call_stop_launch,
    call_stop_worker,
)


def route(c: object) -> tuple[str, str, str, object]:
    return (c.rpc, c.http_method, c.path, c.body)  # type: ignore[attr-defined]


def test_calls_map_onto_their_routes() -> None:
    assert route(call_list_workers("s1")) == ("ListWorkers", "GET", "/sessions/s1/workers", None)
    steer = call_steer_worker("s1", "c/2", "go on")
    assert route(steer) == ("SteerWorker", "POST", "/sessions/s1/workers/c%2F2/steer", {"text": "go on"})
    assert (steer.request.child_id, steer.request.text) == ("c/2", "go on")
    assert route(call_stop_worker("s1", "c2")) == ("StopWorker", "POST", "/sessions/s1/workers/c2/stop", None)
    assert route(call_start_best_of_n("s1", "fix it", 3)) == (
        "StartBestOfN",
        "POST",
        "/sessions/s1/bestofn",
        {"prompt": "fix it", "n": 3},
    )
    assert route(call_keep_candidate("s1", "c2")) == ("KeepCandidate", "POST", "/sessions/s1/keep", {"candidate": "c2"})
    assert route(call_discard_candidate("s1", "c3")) == (
        "DiscardCandidate",
        "POST",
        "/sessions/s1/discard",
        {"candidate": "c3"},
    )
    assert route(call_list_launch("s1")) == ("ListLaunch", "GET", "/sessions/s1/launch", None)
    assert route(call_start_launch("s1", "web")) == ("StartLaunch", "POST", "/sessions/s1/launch/start", {"name": "web"})
    assert route(call_stop_launch("s1", "web")) == ("StopLaunch", "POST", "/sessions/s1/launch/stop", {"name": "web"})
    logs = call_launch_logs("s1", "my web", 20)
    assert route(logs) == ("GetLaunchLogs", "GET", "/sessions/s1/launch/logs?name=my+web&tail=20", None)
    assert (logs.request.name, logs.request.tail) == ("my web", 20)
    assert call_launch_logs("s1", "web").path == "/sessions/s1/launch/logs?name=web"
    assert route(call_get_pr("s1")) == ("GetPr", "GET", "/sessions/s1/pr", None)
    merge = call_merge_pr("s1", 12, "rebase")
    assert route(merge) == ("MergePr", "POST", "/sessions/s1/pr/merge", {"number": 12, "method": "rebase"})
    assert merge.request.method == agent_pb2.MERGE_METHOD_REBASE
    assert call_merge_pr("s1", 12).body == {"number": 12, "method": "squash"}


def test_bad_arguments_are_refused_before_sending() -> None:
    with pytest.raises(VakError) as e:
        call_merge_pr("s1", 1, "fast-forward")
    assert (e.value.status, e.value.code) == (400, "invalid_argument")
    assert "squash, merge, rebase" in e.value.message
    with pytest.raises(VakError):
        call_start_best_of_n("s1", "p", -1)
    with pytest.raises(VakError):
        call_launch_logs("s1", "web", -5)


def test_workers_and_their_events_read_enums_by_json_name() -> None:
    listed = parse_json(
        '{"workers": [{"id": "c1", "parent_id": "p", "kind": "candidate", "state": "finished",'
        ' "branch": "vak/p/c1", "diff_stat": {"files": 2, "insertions": 5, "deletions": 1},'
        ' "summary": "done", "a_newer_field": 1}]}',
        agent_pb2.ListWorkersResponse(),
    )
    w = listed.workers[0]
    assert (json_name(w, "kind"), json_name(w, "state")) == ("candidate", "finished")
    assert (w.diff_stat.files, w.diff_stat.insertions, w.diff_stat.deletions) == (2, 5, 1)

    ev = parse_json(
        '{"seq": 4, "session_id": "p", "worker": {"phase": "spawned", "worker": {"id": "c1", "kind": "worker", "state": "running"}}}',
        agent_pb2.Event(),
    )
    assert ev.WhichOneof("kind") == "worker"
    assert json_name(ev.worker, "phase") == "spawned"
    assert json_name(ev.worker.worker, "state") == "running"
    gone = parse_json('{"draft_discarded": {"candidate": "c2", "branch": "vak/p/c2", "why": "kept_other"}}', agent_pb2.Event())
    assert json_name(gone.draft_discarded, "why") == "kept_other"
    out = parse_json('{"launch_output": {"name": "web", "stream": "stderr", "text": "ready"}}', agent_pb2.Event())
    assert (out.launch_output.name, json_name(out.launch_output, "stream")) == ("web", "stderr")


def test_launch_configs_and_the_pr_view_read_their_enums() -> None:
    r = parse_json(
        '{"configs": [{"name": "web", "command": "npm run dev", "source": "npm", "env": {"PORT": "3000"},'
        ' "running": true, "pid": 42}, {"name": "api", "source": "launch_toml", "exit_code": 0}]}',
        agent_pb2.ListLaunchResponse(),
    )
    web, api = r.configs
    assert (json_name(web, "source"), dict(web.env), web.running, web.pid) == ("npm", {"PORT": "3000"}, True, 42)
    assert json_name(api, "source") == "launch_toml"
    assert api.HasField("exit_code") and not web.HasField("exit_code")
    pr = parse_json('{"reason": "not_a_git_repo", "message": "not a git repository"}', agent_pb2.PrView())
    assert json_name(pr, "reason") == "not_a_git_repo"
    open_pr = parse_json('{"number": 7, "state": "OPEN", "checks": {"passing": 3, "pending": 1}}', agent_pb2.PrView())
    assert (json_name(open_pr, "reason"), open_pr.number, open_pr.checks.passing) == ("", 7, 3)
