// @vak/client: the generated proto types, an AgentService client (gRPC-web or Connect), and
// StreamFollower for the multiplexed SSE stream. Browsers and Node 20+.
export * from "./gen/vak/v1/agent_pb.js";
export { enumFromJsonName, enumJsonName, fromVakJson } from "./enums.js";
export {
  bearer,
  createAgentClient,
  KEY_HEADER,
  keepKey,
  login,
  logout,
  sessionKey,
  storedKey,
  type AgentClient,
  type ClientOptions,
  type ClientProtocol,
} from "./client.js";
export {
  parseCursor,
  StreamFollower,
  type EventSourceConstructor,
  type EventSourceLike,
  type EventSourceMessage,
  type FollowerEvents,
  type FollowerState,
  type StreamFollowerOptions,
} from "./stream.js";
