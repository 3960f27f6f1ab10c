// vak's browser client: the generated proto types, a gRPC-web AgentService
// client, and StreamFollower for the multiplexed SSE stream.
export * from "./gen/vak/v1/agent_pb.js";
export { bearer, createAgentClient, login, logout, type AgentClient, type ClientOptions } from "./client.js";
export {
  parseCursor,
  StreamFollower,
  type FollowerEvents,
  type FollowerState,
  type StreamFollowerOptions,
} from "./stream.js";
