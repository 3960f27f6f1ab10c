"""The task and digest calls without a server: what each sends over gRPC and
REST, and how the REST/SSE JSON of tasks, background results and the digest
is read (enums by their JSON names, also inside repeated fields, nested
messages and a map's values)."""

from __future__ import annotations

import pytest

from vak_client import VakError, agent_pb2, json_name
from vak_client._common import parse_json, to_json
from vak_client._tasks import (
    call_create_task,
    call_delete_task,
    call_digest,
    call_get_task,
    call_list_tasks,
    call_run_task_now,
    call_update_task,
)


def test_calls_map_onto_their_routes() -> None:
    assert (call_list_tasks().http_method, call_list_tasks().path, call_list_tasks().body) == ("GET", "/tasks", None)
    c = call_create_task("disk", script="df -h", schedule="*/15 * * * *")
    assert (c.rpc, c.http_method, c.path) == ("CreateTask", "POST", "/tasks")
    # Only what was given is sent: an absent prompt is no prompt (the server
    # refuses both or neither), and enabled is the server's default.
    assert c.body == {"name": "disk", "script": "df -h", "schedule": "*/15 * * * *"}
    assert not c.request.HasField("prompt") and not c.request.HasField("enabled")
    off = call_create_task("p", prompt="hi", enabled=False, session_id="s1", model_pin="fake/m", workspace="/w")
    assert off.body == {"name": "p", "prompt": "hi", "enabled": False, "session_id": "s1", "model_pin": "fake/m", "workspace": "/w"}
    assert off.request.HasField("enabled") and not off.request.enabled

    g = call_get_task("task_0123456789ab")
    assert (g.rpc, g.http_method, g.path, g.request.task_id) == ("GetTask", "GET", "/tasks/task_0123456789ab", "task_0123456789ab")
    d = call_delete_task("a/b")
    assert (d.http_method, d.path) == ("DELETE", "/tasks/a%2Fb")
    r = call_run_task_now("task_1")
    assert (r.rpc, r.http_method, r.path, r.body) == ("RunTaskNow", "POST", "/tasks/task_1/run-now", None)

    u = call_update_task("task_1", {"enabled": False, "schedule": ""})
    assert (u.rpc, u.http_method, u.path) == ("UpdateTask", "PATCH", "/tasks/task_1")
    # The id travels in the path; "" (clear the schedule) and false are sent as given.
    assert u.body == {"enabled": False, "schedule": ""}
    assert u.request.task_id == "task_1" and u.request.HasField("schedule") and not u.request.HasField("name")
    with pytest.raises(TypeError, match="shedule"):
        call_update_task("task_1", {"shedule": "* * * * *"})

    assert (call_digest().path, call_digest().request.HasField("days")) == ("/digest", False)
    assert (call_digest(30).path, call_digest(30).request.days) == ("/digest?days=30", 30)
    # 0 and 91 go to the server, which refuses them; a negative number cannot be sent as a uint32.
    assert call_digest(0).path == "/digest?days=0" and call_digest(0).request.HasField("days")
    with pytest.raises(VakError) as err:
        call_digest(-1)
    assert (err.value.status, err.value.code) == (400, "invalid_argument") and err.value.message.startswith("days:")


def test_a_background_result_event_reads_its_enums_by_json_name() -> None:
    raw = (
        '{"seq": 7, "session_id": "s", "background_result": {"source": "script", "id": "task_0123456789ab",'
        ' "text": "exit code 3", "alert": true, "reason": "script_failed", "result_id": "bg_0c1d2e3f4a5b",'
        ' "arrived_at": "2026-12-04T09:45:00Z", "summarised": 2}}'
    )
    ev = parse_json(raw, agent_pb2.Event())
    assert ev.WhichOneof("kind") == "background_result"
    b = ev.background_result
    assert (b.source, b.reason) == (agent_pb2.BACKGROUND_SOURCE_SCRIPT, agent_pb2.BACKGROUND_REASON_SCRIPT_FAILED)
    assert (json_name(b, "source"), json_name(b, "reason")) == ("script", "script_failed")
    assert (b.id, b.alert, b.result_id, b.summarised) == ("task_0123456789ab", True, "bg_0c1d2e3f4a5b", 2)
    quiet = parse_json('{"background_result": {"source": "budget", "reason": "", "text": "t"}}', agent_pb2.Event())
    assert json_name(quiet.background_result, "source") == "budget"
    assert json_name(quiet.background_result, "reason") == "" and not quiet.background_result.alert
    # A transcript's background message carries the result too.
    t = parse_json(
        '{"messages": [{"role": "background", "text": "hi", "background": {"source": "task", "reason": "budget_100"}}]}',
        agent_pb2.Transcript(),
    )
    m = t.messages[0]
    assert (m.role, json_name(m, "role")) == (agent_pb2.MESSAGE_ROLE_BACKGROUND, "background")
    assert json_name(m.background, "reason") == "budget_100"
    # And the timeline's item kind.
    item = parse_json('{"kind": "background", "status": "failed"}', agent_pb2.TimelineItem())
    assert (item.kind, item.status) == (agent_pb2.ITEM_KIND_BACKGROUND, agent_pb2.ITEM_STATUS_FAILED)


def test_tasks_read_last_fire_outcomes_inside_a_list() -> None:
    raw = (
        '{"timezone": "Europe/Berlin", "tasks": ['
        '{"id": "task_a", "name": "a", "script": "true", "enabled": true, "next_fire": "2026-12-04T10:45:00+01:00",'
        ' "last_fire": {"at": "2026-12-04T09:30:00Z", "outcome": "script_timeout", "slot": "1764837000"}},'
        '{"id": "task_b", "name": "b", "prompt": "hi", "enabled": false,'
        ' "last_fire": {"outcome": "budget_exceeded", "message": "past the budget"}}]}'
    )
    r = parse_json(raw, agent_pb2.ListTasksResponse())
    assert r.timezone == "Europe/Berlin"
    a, b = r.tasks
    assert json_name(a.last_fire, "outcome") == "script_timeout" and a.HasField("script") and not a.HasField("prompt")
    assert b.last_fire.outcome == agent_pb2.TASK_OUTCOME_BUDGET_EXCEEDED and not b.HasField("next_fire")
    # Written back (to_json), the outcome is its JSON name again.
    assert to_json(b)["last_fire"]["outcome"] == "budget_exceeded"


def test_the_digest_reads_maps_of_usage() -> None:
    usage = '{"usd": 0.25, "input_tokens": "1000", "output_tokens": 200, "calls": 3}'
    raw = (
        '{"days": [{"date": "2026-12-03"}, {"date": "2026-12-04", "usd": 0.25, "input_tokens": 1000,'
        f' "output_tokens": 200, "runs": 2, "by_model": {{"fake/m": {usage}}}, "by_session": {{"s1": {usage}, "s2": {{}}}}}}],'
        f' "total": {usage}, "memory_notes_added": 1, "tasks_fired": 4, "unpriced": ["other/x"],'
        ' "max_day_usd": 2.0, "today_usd": 0.25, "timezone": "UTC", "a_newer_field": 1}'
    )
    d = parse_json(raw, agent_pb2.Digest())
    assert [day.date for day in d.days] == ["2026-12-03", "2026-12-04"]
    today = d.days[1]
    assert (today.usd, today.input_tokens, today.runs) == (0.25, 1000, 2)
    assert sorted(today.by_model) == ["fake/m"] and sorted(today.by_session) == ["s1", "s2"]
    m = today.by_model["fake/m"]
    assert (m.usd, m.input_tokens, m.output_tokens, m.calls) == (0.25, 1000, 200, 3)
    assert today.by_session["s2"] == agent_pb2.DigestUsage()
    assert (d.total.calls, d.tasks_fired, d.memory_notes_added, list(d.unpriced)) == (3, 4, 1, ["other/x"])
    assert d.HasField("max_day_usd") and d.max_day_usd == 2.0 and d.today_usd == 0.25
    assert not parse_json('{"today_usd": 0}', agent_pb2.Digest()).HasField("max_day_usd")
