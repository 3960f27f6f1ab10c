"""The unary calls of commitments, the plan the model keeps (docs/protocol.md
section 38, issue 35): request building for gRPC and REST, shared by the sync
and the asyncio client."""

from __future__ import annotations

from vak_client._common import UnaryCall, VakError, quote, to_json
from vak_client._gen import agent_pb2

# The verdicts `close_commitment` accepts, by their JSON names.
VERDICTS = {
    "fulfilled": agent_pb2.VERDICT_FULFILLED,
    "abandoned": agent_pb2.VERDICT_ABANDONED,
    "superseded": agent_pb2.VERDICT_SUPERSEDED,
}


def _path(commitment_id: str) -> str:
    return f"/commitments/{quote(commitment_id)}"


def call_list_commitments(all: bool = False) -> UnaryCall[agent_pb2.ListCommitmentsRequest, agent_pb2.CommitmentList]:
    # `all=false` is the default: left out of the query, as the request leaves it unset.
    return UnaryCall(
        "ListCommitments",
        agent_pb2.ListCommitmentsRequest(all=all),
        agent_pb2.CommitmentList,
        "GET",
        "/commitments?all=true" if all else "/commitments",
    )


def call_get_commitment(commitment_id: str) -> UnaryCall[agent_pb2.GetCommitmentRequest, agent_pb2.CommitmentDetail]:
    return UnaryCall(
        "GetCommitment",
        agent_pb2.GetCommitmentRequest(id=commitment_id),
        agent_pb2.CommitmentDetail,
        "GET",
        _path(commitment_id),
    )


def call_close_commitment(
    commitment_id: str, verdict: str, note: str | None = None
) -> UnaryCall[agent_pb2.CloseCommitmentRequest, agent_pb2.Commitment]:
    if verdict not in VERDICTS:
        # Refused here as the server refuses it (400), before any call.
        raise VakError(400, "invalid_argument", f"verdict: {verdict!r} is not one of {', '.join(VERDICTS)}")
    req = agent_pb2.CloseCommitmentRequest(id=commitment_id, verdict=VERDICTS[verdict], note=note or "")
    body = to_json(req)
    body.pop("id", None)  # in the path
    return UnaryCall("CloseCommitment", req, agent_pb2.Commitment, "POST", _path(commitment_id) + "/close", body)
