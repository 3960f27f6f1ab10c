"""Scheduled tasks and the digest over gRPC and over REST (the `unary`
fixture), against a server of their own (script tasks make sessions of their
own, which the shared server's session lists must not see): a script task's
output and its failure arrive on the session's stream as `background_result`
and in the transcript as `background` messages; a prompt task runs in its
session; a bad cron is 400 naming `schedule`; the digest's window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from helpers import STEP, Server, finished, kind, serving, take_until

from vak_client import AsyncClient, Client, Event, VakError, agent_pb2, json_name


@pytest.fixture(scope="module")
def tasks_vak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("vak-tasks"))
    yield from serving(server)


@pytest.fixture
def tc(tasks_vak: Server, unary: str) -> Iterator[Client]:
    with tasks_vak.client(unary=unary) as c:
        yield c


def background(ev: Event) -> bool:
    return kind(ev) == "background_result"


def fired(c: Client, task_id: str, outcome: str) -> agent_pb2.Task:
    """The task once its last fire has this outcome (polled within STEP seconds)."""
    end = time.monotonic() + STEP
    while True:
        task = c.get_task(task_id)
        if task.HasField("last_fire") and json_name(task.last_fire, "outcome") == outcome:
            return task
        assert time.monotonic() < end, f"the last fire never became {outcome}: {task}"
        time.sleep(0.05)


def test_a_script_task_delivers_its_output_and_its_failure_to_its_session(tc: Client, transport: str) -> None:
    task = tc.create_task("watchdog", script="echo hi")
    assert task.id.startswith("task_") and task.name == "watchdog" and task.script == "echo hi"
    assert task.enabled and not task.HasField("next_fire") and not task.HasField("prompt")
    # No session named: the script task got one of its own.
    sid = task.session_id
    assert sid and tc.attach(sid).session_id == sid

    with tc.follow(sid, after=0, transport=transport) as events:  # type: ignore[arg-type]
        assert tc.run_task_now(task.id).id == task.id
        got = take_until(events, background, events)
        r = got[-1].background_result
        assert (json_name(r, "source"), r.id, r.text, r.alert, json_name(r, "reason")) == ("script", task.id, "hi", False, "")
        assert r.result_id.startswith("bg_") and r.arrived_at
        last = tc.transcript(sid).messages[-1]
        assert (json_name(last, "role"), last.text) == ("background", "hi")
        assert last.background.result_id == r.result_id
        assert fired(tc, task.id, "delivered").last_fire.session_id == sid

        # A failing script is an alert, with its exit code.
        changed = tc.update_task(task.id, script="echo oops >&2; exit 3")
        assert changed.script == "echo oops >&2; exit 3"
        tc.run_task_now(task.id)
        alert = take_until(events, background, events)[-1].background_result
        assert alert.alert and json_name(alert, "reason") == "script_failed", alert
        assert "3" in alert.text and "oops" in alert.text, alert.text
    fired(tc, task.id, "script_failed")
    items = [i for i in tc.presentation(sid).items if json_name(i, "kind") == "background"]
    assert [json_name(i, "status") for i in items][-1] == "failed"

    # Disabled, listed, deleted.
    assert not tc.update_task(task.id, enabled=False).enabled
    listed = tc.list_tasks()
    assert task.id in [t.id for t in listed.tasks] and listed.timezone
    assert tc.delete_task(task.id).deleted
    with pytest.raises(VakError) as err:
        tc.get_task(task.id)
    assert (err.value.status, err.value.code) == (404, "not_found")


def test_a_prompt_task_runs_in_its_session(tc: Client) -> None:
    sid = tc.create_session()
    task = tc.create_task("ask", prompt="hello from a task", session_id=sid, schedule="0 9 * * MON")
    assert task.schedule == "0 9 * * MON" and task.HasField("next_fire") and task.session_id == sid
    with tc.follow(sid, after=0) as events:
        tc.run_task_now(task.id)
        got = take_until(events, finished, events)
    user = next(e.user_message for e in got if kind(e) == "user_message")
    assert user.text == "hello from a task" and user.request_id.startswith(f"task:{task.id}:"), user
    assert json_name(got[-1].run_finished, "outcome") == "completed"
    assert json_name(tc.get_task(task.id).last_fire, "outcome") in ("started", "queued")
    # An empty string clears the schedule: no next fire.
    cleared = tc.update_task(task.id, schedule="")
    assert not cleared.HasField("schedule") and not cleared.HasField("next_fire")
    tc.delete_task(task.id)


def test_a_bad_task_is_refused_naming_its_field(tc: Client) -> None:
    for kwargs, field in (
        ({"script": "true", "schedule": "61 * * * *"}, "schedule"),
        ({"script": "true", "schedule": "* * *"}, "schedule"),
        ({}, "prompt"),
        ({"prompt": "a", "script": "b"}, "prompt"),
    ):
        with pytest.raises(VakError) as err:
            tc.create_task("bad", **kwargs)  # type: ignore[arg-type]
        assert (err.value.status, err.value.code) == (400, "invalid_argument"), err.value
        assert err.value.message.startswith(f"{field}:"), err.value.message
    with pytest.raises(VakError) as err:
        tc.run_task_now("task_000000000000")
    assert err.value.status == 404
    assert "bad" not in [t.name for t in tc.list_tasks().tasks]


def test_the_digest_has_the_window_asked_for(tc: Client) -> None:
    d = tc.digest(days=3)
    assert len(d.days) == 3 and d.timezone
    assert d.days[0].date < d.days[-1].date
    assert len(tc.digest().days) == 7
    for days in (0, 91):
        with pytest.raises(VakError) as err:
            tc.digest(days)
        assert (err.value.status, err.value.code) == (400, "invalid_argument"), days


def test_async_client(tasks_vak: Server, unary: str) -> None:
    async def main() -> None:
        async with AsyncClient(tasks_vak.url, tasks_vak.token, unary=unary) as c:  # type: ignore[arg-type]
            task = await c.create_task("async", script="echo async hi")
            async with c.follow(task.session_id, after=0) as events:
                await c.run_task_now(task.id)
                async for ev in events:
                    if kind(ev) == "background_result":
                        assert ev.background_result.text == "async hi"
                        break
            assert (await c.get_task(task.id)).id == task.id
            assert (await c.update_task(task.id, name="renamed")).name == "renamed"
            assert task.id in [t.id for t in (await c.list_tasks()).tasks]
            assert (await c.delete_task(task.id)).deleted
            with pytest.raises(VakError) as err:
                await c.create_task("bad", script="true", schedule="nope")
            assert err.value.status == 400 and err.value.message.startswith("schedule:")
            assert len((await c.digest(1)).days) == 1

    asyncio.run(asyncio.wait_for(main(), STEP))
