// vak's enums by their JSON names. The REST/SSE JSON carries each enum value
// by the string the field carried before it was an enum ("completed",
// "accept-edits"): the value's name without its enum's prefix, lower-cased,
// "" for UNSPECIFIED, unless its `(vak.v1.json)` option names it otherwise
// (proto/vak/v1/http.proto). gRPC-web carries the numbers. protobuf-es's JSON
// reader knows only the proto names, so the SSE frames go through
// `fromVakJson`, and code that shows or compares a value uses `enumJsonName`.
import { fromJson, getOption, hasOption, type DescEnum, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import { json as jsonOption } from "./gen/vak/v1/http_pb.js";

/** `RunOutcome` → `RUN_OUTCOME_`. */
function prefixOf(e: DescEnum): string {
  return e.name.replace(/(?<!^)([A-Z])/g, "_$1").toUpperCase() + "_";
}

/** The JSON name of value `n` of `e` (its number as a string if `e` has no such value). */
export function enumJsonName(e: DescEnum, n: number): string {
  const v = e.values.find((v) => v.number === n);
  if (!v) return String(n);
  if (hasOption(v, jsonOption)) return getOption(v, jsonOption);
  const prefix = prefixOf(e);
  const rest = v.name.startsWith(prefix) ? v.name.slice(prefix.length) : v.name;
  return rest === "UNSPECIFIED" ? "" : rest.toLowerCase();
}

/** The number of the value of `e` a JSON name names, if any. */
export function enumFromJsonName(e: DescEnum, name: string): number | undefined {
  return e.values.find((v) => enumJsonName(e, v.number) === name)?.number;
}

/** A JSON object of `desc` with vak's enum JSON names replaced by their numbers (which fromJson reads). */
function enumNumbers(desc: DescMessage, obj: JsonValue): JsonValue {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) return obj;
  const out: { [k: string]: JsonValue } = {};
  for (const [key, value] of Object.entries(obj)) {
    const f = desc.fields.find((f) => f.name === key || f.jsonName === key);
    let v = value;
    if (f) {
      const e =
        f.fieldKind === "enum" || (f.fieldKind === "list" && f.listKind === "enum") || (f.fieldKind === "map" && f.mapKind === "enum")
          ? f.enum
          : undefined;
      const m =
        f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message") || (f.fieldKind === "map" && f.mapKind === "message")
          ? f.message
          : undefined;
      let each: ((x: JsonValue) => JsonValue) | undefined;
      if (e && e.typeName.startsWith("vak.")) each = (x) => (typeof x === "string" ? (enumFromJsonName(e, x) ?? x) : x);
      else if (m && !m.typeName.startsWith("google.")) each = (x) => enumNumbers(m, x);
      if (each && f.fieldKind === "map" && value !== null && typeof value === "object" && !Array.isArray(value)) {
        // A map's values (McpConfig.servers: McpServer by name), keyed by strings.
        v = Object.fromEntries(Object.entries(value).map(([k, x]) => [k, each(x)]));
      } else if (each) {
        v = Array.isArray(value) ? value.map(each) : each(value);
      }
    }
    out[key] = v;
  }
  return out;
}

/** Reads vak's JSON (a REST answer, an SSE frame's data) as `schema`; fields it does not know are ignored. */
export function fromVakJson<Desc extends DescMessage>(schema: Desc, text: string): MessageShape<Desc> {
  return fromJson(schema, enumNumbers(schema, JSON.parse(text) as JsonValue), { ignoreUnknownFields: true });
}
