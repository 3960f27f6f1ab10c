"""The unary calls of scheduled tasks and the usage digest (docs/protocol.md
section 31): request building for gRPC and REST, shared by the sync and the
asyncio client."""

from __future__ import annotations

import urllib.parse
from typing import Any

from vak_client._common import UnaryCall, VakError, quote, to_json
from vak_client._gen import agent_pb2

# What `update_task` may change: UpdateTaskRequest's fields but its id.
TASK_FIELDS = tuple(f.name for f in agent_pb2.UpdateTaskRequest.DESCRIPTOR.fields if f.name != "task_id")


def _task_path(task_id: str) -> str:
    return f"/tasks/{quote(task_id)}"


def call_list_tasks() -> UnaryCall[agent_pb2.ListTasksRequest, agent_pb2.ListTasksResponse]:
    return UnaryCall("ListTasks", agent_pb2.ListTasksRequest(), agent_pb2.ListTasksResponse, "GET", "/tasks")


def call_create_task(
    name: str,
    *,
    prompt: str | None = None,
    script: str | None = None,
    schedule: str | None = None,
    session_id: str | None = None,
    model_pin: str | None = None,
    enabled: bool | None = None,
    workspace: str | None = None,
) -> UnaryCall[agent_pb2.CreateTaskRequest, agent_pb2.TaskResponse]:
    # None leaves a field out (its optional presence unset): the server's
    # defaults apply, and its validation names what is missing.
    given: dict[str, Any] = {
        "prompt": prompt,
        "script": script,
        "schedule": schedule,
        "session_id": session_id,
        "model_pin": model_pin,
        "enabled": enabled,
        "workspace": workspace,
    }
    req = agent_pb2.CreateTaskRequest(name=name, **{k: v for k, v in given.items() if v is not None})
    return UnaryCall("CreateTask", req, agent_pb2.TaskResponse, "POST", "/tasks", to_json(req))


def call_get_task(task_id: str) -> UnaryCall[agent_pb2.GetTaskRequest, agent_pb2.TaskResponse]:
    return UnaryCall(
        "GetTask", agent_pb2.GetTaskRequest(task_id=task_id), agent_pb2.TaskResponse, "GET", _task_path(task_id)
    )


def call_update_task(task_id: str, fields: dict[str, Any]) -> UnaryCall[agent_pb2.UpdateTaskRequest, agent_pb2.TaskResponse]:
    """`fields`: the ones to change (an empty string clears schedule, session_id
    or model_pin); a name UpdateTaskRequest does not have is a TypeError."""
    unknown = sorted(set(fields) - set(TASK_FIELDS))
    if unknown:
        raise TypeError(f"update_task: unknown field(s) {', '.join(unknown)}; expected some of {', '.join(TASK_FIELDS)}")
    req = agent_pb2.UpdateTaskRequest(task_id=task_id, **{k: v for k, v in fields.items() if v is not None})
    body = to_json(req)
    body.pop("task_id", None)  # in the path
    return UnaryCall("UpdateTask", req, agent_pb2.TaskResponse, "PATCH", _task_path(task_id), body)


def call_delete_task(task_id: str) -> UnaryCall[agent_pb2.DeleteTaskRequest, agent_pb2.DeleteTaskResponse]:
    return UnaryCall(
        "DeleteTask",
        agent_pb2.DeleteTaskRequest(task_id=task_id),
        agent_pb2.DeleteTaskResponse,
        "DELETE",
        _task_path(task_id),
    )


def call_run_task_now(task_id: str) -> UnaryCall[agent_pb2.RunTaskNowRequest, agent_pb2.TaskResponse]:
    return UnaryCall(
        "RunTaskNow",
        agent_pb2.RunTaskNowRequest(task_id=task_id),
        agent_pb2.TaskResponse,
        "POST",
        _task_path(task_id) + "/run-now",
    )


def call_digest(days: int | None = None) -> UnaryCall[agent_pb2.GetDigestRequest, agent_pb2.Digest]:
    req = agent_pb2.GetDigestRequest()
    query = ""
    if days is not None:
        # Sent as given: the server refuses one outside 1 to 90 (400), over
        # REST too; a negative one cannot be a uint32, so it is refused here alike.
        if days < 0:
            raise VakError(400, "invalid_argument", f"days: {days} is not between 1 and 90")
        req.days = days
        query = "?" + urllib.parse.urlencode({"days": days})
    return UnaryCall("GetDigest", req, agent_pb2.Digest, "GET", "/digest" + query)
