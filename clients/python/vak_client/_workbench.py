"""The unary calls of workers, best-of-N, dev servers and the PR view
(docs/protocol.md section 33, issue 30): request building for gRPC and REST,
shared by the sync and the asyncio client."""

from __future__ import annotations

import urllib.parse
from typing import Any

from google.protobuf.message import Message

from vak_client._common import UnaryCall, VakError, quote, to_json
from vak_client._gen import agent_pb2

# The merge methods `merge_pr` accepts, by their JSON names.
MERGE_METHODS = {
    "squash": agent_pb2.MERGE_METHOD_SQUASH,
    "merge": agent_pb2.MERGE_METHOD_MERGE,
    "rebase": agent_pb2.MERGE_METHOD_REBASE,
}


def _session(session_id: str, rest: str) -> str:
    return f"/sessions/{quote(session_id)}/{rest}"


def _body(req: Message, *path_fields: str) -> dict[str, Any]:
    """The request's REST body: its JSON without the fields the path carries."""
    body = to_json(req)
    for f in ("session_id", *path_fields):
        body.pop(f, None)
    return body


def call_list_workers(session_id: str) -> UnaryCall[agent_pb2.ListWorkersRequest, agent_pb2.ListWorkersResponse]:
    return UnaryCall(
        "ListWorkers",
        agent_pb2.ListWorkersRequest(session_id=session_id),
        agent_pb2.ListWorkersResponse,
        "GET",
        _session(session_id, "workers"),
    )


def call_steer_worker(session_id: str, child_id: str, text: str) -> UnaryCall[agent_pb2.SteerWorkerRequest, agent_pb2.Worker]:
    req = agent_pb2.SteerWorkerRequest(session_id=session_id, child_id=child_id, text=text)
    return UnaryCall(
        "SteerWorker",
        req,
        agent_pb2.Worker,
        "POST",
        _session(session_id, f"workers/{quote(child_id)}/steer"),
        _body(req, "child_id"),
    )


def call_stop_worker(session_id: str, child_id: str) -> UnaryCall[agent_pb2.StopWorkerRequest, agent_pb2.Worker]:
    return UnaryCall(
        "StopWorker",
        agent_pb2.StopWorkerRequest(session_id=session_id, child_id=child_id),
        agent_pb2.Worker,
        "POST",
        _session(session_id, f"workers/{quote(child_id)}/stop"),
    )


def call_start_best_of_n(
    session_id: str, prompt: str, n: int
) -> UnaryCall[agent_pb2.StartBestOfNRequest, agent_pb2.StartBestOfNResponse]:
    if n < 0:
        # Not a uint32: refused here as the server refuses one out of range.
        raise VakError(400, "invalid_argument", f"n: {n} is not between 2 and the server's --max-bestofn")
    req = agent_pb2.StartBestOfNRequest(session_id=session_id, prompt=prompt, n=n)
    return UnaryCall(
        "StartBestOfN", req, agent_pb2.StartBestOfNResponse, "POST", _session(session_id, "bestofn"), _body(req)
    )


def call_keep_candidate(
    session_id: str, candidate: str
) -> UnaryCall[agent_pb2.KeepCandidateRequest, agent_pb2.KeepCandidateResponse]:
    req = agent_pb2.KeepCandidateRequest(session_id=session_id, candidate=candidate)
    return UnaryCall(
        "KeepCandidate", req, agent_pb2.KeepCandidateResponse, "POST", _session(session_id, "keep"), _body(req)
    )


def call_discard_candidate(
    session_id: str, candidate: str
) -> UnaryCall[agent_pb2.DiscardCandidateRequest, agent_pb2.DraftDiscarded]:
    req = agent_pb2.DiscardCandidateRequest(session_id=session_id, candidate=candidate)
    return UnaryCall(
        "DiscardCandidate", req, agent_pb2.DraftDiscarded, "POST", _session(session_id, "discard"), _body(req)
    )


def call_list_launch(session_id: str) -> UnaryCall[agent_pb2.ListLaunchRequest, agent_pb2.ListLaunchResponse]:
    return UnaryCall(
        "ListLaunch",
        agent_pb2.ListLaunchRequest(session_id=session_id),
        agent_pb2.ListLaunchResponse,
        "GET",
        _session(session_id, "launch"),
    )


def call_start_launch(session_id: str, name: str) -> UnaryCall[agent_pb2.StartLaunchRequest, agent_pb2.LaunchStarted]:
    req = agent_pb2.StartLaunchRequest(session_id=session_id, name=name)
    return UnaryCall(
        "StartLaunch", req, agent_pb2.LaunchStarted, "POST", _session(session_id, "launch/start"), _body(req)
    )


def call_stop_launch(session_id: str, name: str) -> UnaryCall[agent_pb2.StopLaunchRequest, agent_pb2.LaunchStopped]:
    req = agent_pb2.StopLaunchRequest(session_id=session_id, name=name)
    return UnaryCall(
        "StopLaunch", req, agent_pb2.LaunchStopped, "POST", _session(session_id, "launch/stop"), _body(req)
    )


def call_launch_logs(
    session_id: str, name: str, tail: int | None = None
) -> UnaryCall[agent_pb2.GetLaunchLogsRequest, agent_pb2.LaunchLogs]:
    req = agent_pb2.GetLaunchLogsRequest(session_id=session_id, name=name)
    query: dict[str, Any] = {"name": name}
    if tail is not None:
        if tail < 0:
            raise VakError(400, "invalid_argument", f"tail: {tail} is not a number of lines")
        req.tail = tail
        query["tail"] = tail
    path = _session(session_id, "launch/logs") + "?" + urllib.parse.urlencode(query)
    return UnaryCall("GetLaunchLogs", req, agent_pb2.LaunchLogs, "GET", path)


def call_get_pr(session_id: str) -> UnaryCall[agent_pb2.GetPrRequest, agent_pb2.PrView]:
    return UnaryCall(
        "GetPr", agent_pb2.GetPrRequest(session_id=session_id), agent_pb2.PrView, "GET", _session(session_id, "pr")
    )


def call_merge_pr(
    session_id: str, number: int, method: str = "squash"
) -> UnaryCall[agent_pb2.MergePrRequest, agent_pb2.MergePrResponse]:
    if method not in MERGE_METHODS:
        raise VakError(400, "invalid_argument", f"method: {method!r} is not one of {', '.join(MERGE_METHODS)}")
    if number < 0:
        raise VakError(400, "invalid_argument", f"number: {number} is not a PR number")
    req = agent_pb2.MergePrRequest(session_id=session_id, number=number, method=MERGE_METHODS[method])
    return UnaryCall("MergePr", req, agent_pb2.MergePrResponse, "POST", _session(session_id, "pr/merge"), _body(req))
