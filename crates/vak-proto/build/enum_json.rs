//! The JSON names of proto/'s enum values, decided once here for the JSON mapping, the generated `json_name`/`from_json_name` and the OpenAPI document.
//!
//! The rule: the value's name without its enum's prefix (`RUN_OUTCOME_` for
//! `RunOutcome`), lower-cased, and "" for the `UNSPECIFIED` value; a value's
//! `(vak.v1.json)` option overrides it (`accept-edits`). Those are the strings
//! the fields carried before they were enums, so the REST/SSE JSON is unchanged.
//!
//! The proto3 JSON mapping writes and reads an enum by its values' names, so
//! the mapping's descriptor set (`vak_json_descriptor.bin`) is proto/'s with
//! every vak enum value renamed to its JSON name. Enum values are scoped
//! beside their enum (C++ rules), so `completed` of two enums would collide:
//! each enum moves into a message of its own there (`RunOutcome` becomes
//! `RunOutcomeJson.RunOutcome`). Only the names change, never a number, so a
//! message transcodes between the two sets unchanged.

use prost_reflect::prost_types::{DescriptorProto, FileDescriptorSet};
use prost_reflect::{DescriptorPool, EnumDescriptor, EnumValueDescriptor};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

/// The package whose enums the JSON mapping names (the others, google.protobuf's, keep theirs).
const PACKAGE: &str = "vak.v1";

/// `RunOutcome` → `RUN_OUTCOME_`.
fn prefix(enum_name: &str) -> String {
    let mut out = String::new();
    for (i, c) in enum_name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out + "_"
}

/// A value's JSON name (see the module's doc).
pub fn json_name(value: &EnumValueDescriptor) -> String {
    let pool = value.parent_enum().parent_pool().clone();
    if let Some(ext) = pool.get_extension_by_name("vak.v1.json") {
        let options = value.options();
        if options.has_extension(&ext) {
            return options
                .get_extension(&ext)
                .as_str()
                .expect("(vak.v1.json) is a string")
                .to_string();
        }
    }
    let e = value.parent_enum();
    let rest = value.name().strip_prefix(&prefix(e.name())).unwrap_or_else(|| {
        panic!(
            "{}: every value of {} starts with {}",
            value.name(),
            e.name(),
            prefix(e.name())
        )
    });
    if rest == "UNSPECIFIED" {
        String::new()
    } else {
        rest.to_ascii_lowercase()
    }
}

/// vak's enums, each checked: declared at the top level, named in the
/// PREFIX_VALUE style, its JSON names distinct.
pub fn enums(pool: &DescriptorPool) -> Vec<EnumDescriptor> {
    let out: Vec<EnumDescriptor> = pool.all_enums().filter(|e| e.package_name() == PACKAGE).collect();
    for e in &out {
        assert!(
            e.parent_message().is_none(),
            "{}: declare vak's enums at the top level (build/enum_json.rs nests them only from there)",
            e.full_name()
        );
        let names: BTreeSet<String> = e.values().map(|v| json_name(&v)).collect();
        assert_eq!(
            names.len(),
            e.values().len(),
            "{}: two values share a JSON name",
            e.full_name()
        );
    }
    out
}

/// The descriptor set the JSON mapping reads: `fds` with vak's enum values
/// renamed to their JSON names, each enum nested in a message of its own.
pub fn json_descriptor_set(pool: &DescriptorPool, fds: &FileDescriptorSet) -> FileDescriptorSet {
    let renamed: HashMap<String, Vec<String>> = enums(pool)
        .iter()
        .map(|e| {
            (
                e.full_name().to_string(),
                e.values().map(|v| json_name(&v)).collect(),
            )
        })
        .collect();
    let mut out = fds.clone();
    let mut moved = HashMap::new();
    for file in out.file.iter_mut().filter(|f| f.package() == PACKAGE) {
        // Its comments' paths would point at the wrong elements now.
        file.source_code_info = None;
        for mut e in std::mem::take(&mut file.enum_type) {
            let full = format!(".{PACKAGE}.{}", e.name());
            for (v, json) in e.value.iter_mut().zip(&renamed[&full[1..]]) {
                v.name = Some(json.clone());
                v.options = None;
            }
            let holder = format!("{}Json", e.name());
            assert!(
                pool.get_message_by_name(&format!("{PACKAGE}.{holder}")).is_none(),
                "{holder} is taken: build/enum_json.rs needs the name"
            );
            moved.insert(full, format!(".{PACKAGE}.{holder}.{}", e.name()));
            file.message_type.push(DescriptorProto {
                name: Some(holder),
                enum_type: vec![e],
                ..Default::default()
            });
        }
    }
    fn retarget(m: &mut DescriptorProto, moved: &HashMap<String, String>) {
        for f in &mut m.field {
            if let Some(to) = f.type_name.as_ref().and_then(|t| moved.get(t)) {
                f.type_name = Some(to.clone());
            }
        }
        for n in &mut m.nested_type {
            retarget(n, moved);
        }
    }
    for file in &mut out.file {
        for m in &mut file.message_type {
            retarget(m, &moved);
        }
        for f in &mut file.extension {
            if let Some(to) = f.type_name.as_ref().and_then(|t| moved.get(t)) {
                f.type_name = Some(to.clone());
            }
        }
    }
    out
}

/// Rust for `vak_proto::v1`: each enum's `json_name` and `from_json_name`,
/// and `JSON_NAMES`, the whole table (for tests and tools).
pub fn rust(pool: &DescriptorPool) -> String {
    let mut s = String::from("// Generated by crates/vak-proto/build/enum_json.rs from proto/.\n\n");
    let mut table = String::new();
    for e in enums(pool) {
        let name = e.name();
        let arms: Vec<(i32, String)> = e.values().map(|v| (v.number(), json_name(&v))).collect();
        let _ = writeln!(s, "impl {name} {{");
        let _ = writeln!(s, "    /// This value's name in the REST/SSE JSON.");
        let _ = writeln!(s, "    pub fn json_name(self) -> &'static str {{");
        let _ = writeln!(s, "        match self as i32 {{");
        for (n, j) in &arms {
            let _ = writeln!(s, "            {n} => {j:?},");
        }
        let _ = writeln!(
            s,
            "            _ => unreachable!(\"every {name} value is listed\"),"
        );
        let _ = writeln!(s, "        }}\n    }}");
        let _ = writeln!(s, "    /// The value a JSON name names, if any.");
        let _ = writeln!(s, "    pub fn from_json_name(name: &str) -> Option<Self> {{");
        let _ = writeln!(s, "        let n = match name {{");
        for (n, j) in &arms {
            let _ = writeln!(s, "            {j:?} => {n},");
        }
        let _ = writeln!(s, "            _ => return None,");
        let _ = writeln!(s, "        }};\n        Self::try_from(n).ok()\n    }}\n}}\n");
        let pairs: Vec<String> = arms.iter().map(|(n, j)| format!("({n}, {j:?})")).collect();
        let _ = writeln!(table, "    ({:?}, &[{}]),", e.full_name(), pairs.join(", "));
    }
    let _ = writeln!(
        s,
        "/// Every vak enum (full name) with its values' numbers and JSON names.\npub const JSON_NAMES: &[(&str, &[(i32, &str)])] = &[\n{table}];"
    );
    s
}
