"""A typed client for the vak agent server.

`Client` (blocking) and `AsyncClient` (asyncio) talk to one server over
both of its surfaces, which share one port and one bearer token: unary calls
over gRPC (or REST with `unary="rest"`), event streams over SSE (or gRPC
with `transport="grpc"`). `follow()` and `follow_many()` return iterators
that resume transparently after a connection loss, with no duplicate and no
gap. REST and SSE go through httpx and httpx-sse, gRPC through grpcio.
Messages are the classes generated from proto/vak/v1/agent.proto when the
package is built (`vak_client.agent_pb2`); every failure is a `VakError`.

Proxy settings from the environment are ignored: the server is reached
directly.
"""

from __future__ import annotations

# _common first: it explains a missing generated package.
from vak_client._common import (
    Backoff,
    McpServers,
    ProtocolError,
    StreamItem,
    StreamMessage,
    Transport,
    Unary,
    VakError,
    enum_from_json_name,
    enum_json_name,
    json_name,
)
from vak_client._async import AsyncClient, AsyncFollower, AsyncStreamFollower
from vak_client._gen import agent_pb2, agent_pb2_grpc
from vak_client._sync import Client, Follower, RestResponse, StreamFollower, Subscription

Event = agent_pb2.Event
Admission = agent_pb2.Admission

__all__ = [
    "Admission",
    "AsyncClient",
    "AsyncFollower",
    "AsyncStreamFollower",
    "Backoff",
    "Client",
    "Event",
    "Follower",
    "McpServers",
    "ProtocolError",
    "RestResponse",
    "StreamFollower",
    "StreamItem",
    "StreamMessage",
    "Subscription",
    "Transport",
    "Unary",
    "VakError",
    "agent_pb2",
    "agent_pb2_grpc",
    "enum_from_json_name",
    "enum_json_name",
    "json_name",
]
