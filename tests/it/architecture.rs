//! The structure ARCHITECTURE.md promises, checked: which crate may depend on which, no
//! import cycle between the files of a crate, and source files one can hold in one's head.
//!
//! The cycle check reads every `crate::`, `super::` and `self::` path in a crate's
//! non-test code (groups `{a, b::c}` included), resolves each to the file that defines
//! that module, and looks for strongly connected components of that file graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// vak's own crates, and the vak crates each may depend on (ARCHITECTURE.md, "The crates").
const ALLOWED: &[(&str, &[&str])] = &[
    ("vak-proto", &[]),
    ("vak-core", &["vak-proto"]),
    ("vak-server", &["vak-proto", "vak-core"]),
    ("vak-term", &["vak-proto"]),
    ("vak-bench", &["vak-proto"]),
];

/// What the core must never depend on directly: the wire's frameworks.
const NOT_IN_CORE: &[&str] = &[
    "tonic",
    "tonic-web",
    "tonic-health",
    "tonic-reflection",
    "axum",
    "hyper",
    "hyper-util",
    "tower",
];

#[test]
fn the_crates_keep_their_boundaries() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let mut problems = Vec::new();
    for (name, allowed) in ALLOWED {
        let Some(p) = packages.iter().find(|p| p["name"] == *name) else {
            problems.push(format!("{name}: not a member of the workspace"));
            continue;
        };
        for dep in p["dependencies"].as_array().unwrap() {
            if dep["kind"].as_str().is_some() {
                continue; // dev and build dependencies: tests and build scripts
            }
            let dep_name = dep["name"].as_str().unwrap();
            if dep_name.starts_with("vak") && !allowed.contains(&dep_name) {
                problems.push(format!("{name} depends on {dep_name}"));
            }
            if *name == "vak-core" && NOT_IN_CORE.contains(&dep_name) {
                problems.push(format!("vak-core depends on {dep_name}"));
            }
            if *name == "vak-core" && dep_name == "vak-proto" {
                let wire = dep["features"].as_array().unwrap().iter().any(|f| f == "wire");
                if dep["uses_default_features"] == true || wire {
                    problems.push("vak-core takes vak-proto's generated code (feature `wire`)".into());
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The cycles left to break (issue 27): each entry is one strongly connected set of
/// files. The test fails on any other cycle and on one of these that grew; shrink the
/// list as they are broken.
const KNOWN_CYCLES: &[(&str, &[&str])] = &[];

#[test]
fn no_files_of_a_crate_import_each_other_in_a_cycle() {
    let mut problems = Vec::new();
    let mut seen = vec![false; KNOWN_CYCLES.len()];
    for (crate_name, src) in crate_sources() {
        for cycle in cycles(&src) {
            let known = KNOWN_CYCLES
                .iter()
                .position(|(c, files)| *c == crate_name && cycle.iter().all(|m| files.contains(&m.as_str())));
            match known {
                Some(i) => seen[i] = true,
                None => problems.push(format!("{crate_name}: {}", cycle.join(" -> "))),
            }
        }
    }
    // A broken cycle leaves the list, so it cannot come back unnoticed.
    for (i, (c, files)) in KNOWN_CYCLES.iter().enumerate() {
        if !seen[i] {
            problems.push(format!(
                "{c}: {files:?} is no longer a cycle: remove it from KNOWN_CYCLES"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "import cycles between files:\n{}",
        problems.join("\n")
    );
}

/// What each of vak-core's top-level modules (a subsystem folder or a leaf file) may
/// import from the others; ARCHITECTURE.md's folder table says the same in words. A new
/// arrow between subsystems fails the test until it is added here on purpose, and an
/// arrow that no longer exists must leave the list, so it stays the true picture.
const CORE_IMPORTS: &[(&str, &[&str])] = &[
    (
        "cluster",
        &[
            "automation",
            "event",
            "host",
            "log",
            "mcp",
            "metrics_names",
            "provider",
            "reasons",
            "route",
            "rule",
            "session",
            "stopped",
        ],
    ),
    (
        "event",
        &[
            "background",
            "commitment",
            "goal",
            "provider",
            "receipt",
            "worker",
        ],
    ),
    ("finops", &["background", "home", "provider", "route", "zone"]),
    (
        "host",
        &[
            "automation",
            "background",
            "cluster",
            "commitment",
            "event",
            "file_owner",
            "finops",
            "home",
            "intent",
            "log",
            "mcp",
            "provider",
            "reasons",
            "route",
            "rule",
            "session",
            "stopped",
            "stream",
            "tools",
            "worker",
            "workspace",
            "zone",
        ],
    ),
    (
        "log",
        &[
            "background",
            "commitment",
            "event",
            "goal",
            "metrics_names",
            "provider",
            "receipt",
            "stopped",
            "trace",
        ],
    ),
    ("intent", &["commitment", "permissions", "tools"]),
    ("mcp", &["file_owner", "provider", "tools"]),
    ("permissions", &["tools"]),
    ("reasons", &["stopped"]),
    ("receipt", &["provider"]),
    ("route", &["provider"]),
    ("rule", &["mcp", "tools", "workspace"]),
    (
        "session",
        &[
            "background",
            "cluster",
            "commitment",
            "event",
            "finops",
            "goal",
            "home",
            "host",
            "intent",
            "log",
            "mcp",
            "metrics_names",
            "permissions",
            "provider",
            "reasons",
            "receipt",
            "route",
            "stopped",
            "stream",
            "tools",
            "trace",
            "worker",
            "workspace",
        ],
    ),
    (
        "stream",
        &["event", "host", "log", "metrics_names", "reasons", "session"],
    ),
    ("tools", &["commitment", "event", "provider", "workspace"]),
    ("trace", &["provider"]),
];

#[test]
fn the_core_subsystems_import_only_what_the_table_allows() {
    let src = repo().join("crates/vak-core/src");
    let mut actual: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, deps) in file_edges(&src) {
        let Some(a) = from.first() else { continue };
        for to in deps {
            let b = &to[0];
            if a != b {
                actual.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    let allowed: BTreeMap<String, BTreeSet<String>> = CORE_IMPORTS
        .iter()
        .map(|(a, bs)| (a.to_string(), bs.iter().map(|b| b.to_string()).collect()))
        .collect();
    let mut problems = Vec::new();
    for (a, bs) in &actual {
        for b in bs {
            if !allowed.get(a).is_some_and(|x| x.contains(b)) {
                problems.push(format!("{a} imports {b}, which CORE_IMPORTS does not allow"));
            }
        }
    }
    for (a, bs) in &allowed {
        for b in bs {
            if !actual.get(a).is_some_and(|x| x.contains(b)) {
                problems.push(format!("{a} no longer imports {b}: remove it from CORE_IMPORTS"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Files over this many lines, and the ones still over it (issue 27 splits them).
const MAX_LINES: usize = 1200;
const KNOWN_LONG: &[&str] = &[];

#[test]
fn no_source_file_is_over_1200_lines() {
    let mut problems = Vec::new();
    for (_, src) in crate_sources() {
        for f in rust_files(&src) {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            let rel = f.strip_prefix(repo()).unwrap().display().to_string();
            if lines > MAX_LINES && !KNOWN_LONG.contains(&rel.as_str()) {
                problems.push(format!("{rel}: {lines} lines"));
            }
            if lines <= MAX_LINES && KNOWN_LONG.contains(&rel.as_str()) {
                problems.push(format!("{rel}: {lines} lines now: remove it from KNOWN_LONG"));
            }
        }
    }
    for rel in KNOWN_LONG {
        if !repo().join(rel).exists() {
            problems.push(format!("{rel} does not exist: remove it from KNOWN_LONG"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Each crate's name and `src/` folder (the root package is `vak`).
fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut out = vec![("vak".to_string(), repo().join("src"))];
    for e in std::fs::read_dir(repo().join("crates")).unwrap() {
        let p = e.unwrap().path();
        if p.join("Cargo.toml").is_file() {
            out.push((
                p.file_name().unwrap().to_string_lossy().into_owned(),
                p.join("src"),
            ));
        }
    }
    out
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A file's module path: `a/b.rs` and `a/b/mod.rs` are `[a, b]`; lib.rs and main.rs are `[]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main")
        || parts.last().is_some_and(|l| l == "mod")
    {
        parts.pop();
    }
    parts
}

/// The code a build without `cfg(test)` compiles, roughly: comments and the trailing
/// `#[cfg(test)] mod tests` removed (a test may import from anywhere).
fn non_test_code(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path `crate::a::b`, `super::a`, `self::a` names, with `{x, y::z}` groups expanded.
fn paths_in(code: &str) -> Vec<(String, Vec<String>)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let base = ["crate", "super", "self"].into_iter().find(|b| {
            bytes[i..].starts_with(b.as_bytes())
                && (i == 0 || !ident(bytes[i - 1]))
                && bytes[i + b.len()..].starts_with(b"::")
        });
        let Some(base) = base else {
            i += 1;
            continue;
        };
        let mut j = i + base.len();
        let mut segs = Vec::new();
        let mut supers = 0;
        while bytes[j..].starts_with(b"::") {
            let s = j + 2;
            let mut e = s;
            while e < bytes.len() && ident(bytes[e]) {
                e += 1;
            }
            if e == s {
                break;
            }
            let seg = &code[s..e];
            if seg == "super" && segs.is_empty() {
                supers += 1;
            } else {
                segs.push(seg.to_string());
            }
            j = e;
        }
        let mut prefixes = vec![segs.clone()];
        if bytes[j..].starts_with(b"::{") {
            let start = j + 3;
            let mut depth = 1;
            let mut k = start;
            while k < bytes.len() && depth > 0 {
                match bytes[k] {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    _ => {}
                }
                k += 1;
            }
            for item in code[start..k.saturating_sub(1)].split(',') {
                let item = item.split(" as ").next().unwrap().trim();
                let item: String = item
                    .chars()
                    .filter(|c| !matches!(c, '{' | '}') && !c.is_whitespace())
                    .collect();
                if !item.is_empty() && item != "self" {
                    let mut p = segs.clone();
                    p.extend(item.split("::").filter(|s| !s.is_empty()).map(str::to_string));
                    prefixes.push(p);
                }
            }
            j = k;
        }
        let key = format!("{base}{}", "+".repeat(supers));
        for p in prefixes {
            out.push((key.clone(), p));
        }
        i = j.max(i + 1);
    }
    out
}

/// Which files each file of a crate imports (`use` and paths in code, tests left out), by module path.
fn file_edges(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files: BTreeMap<Vec<String>, PathBuf> = rust_files(src)
        .into_iter()
        .map(|f| (module_of(src, &f), f))
        .collect();
    let resolve = |parts: &[String]| -> Option<Vec<String>> {
        (0..=parts.len())
            .rev()
            .map(|k| parts[..k].to_vec())
            .find(|p| files.contains_key(p))
    };
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &files {
        let code = non_test_code(&std::fs::read_to_string(file).unwrap());
        let mut deps = BTreeSet::new();
        for (base, rest) in paths_in(&code) {
            let supers = base.matches('+').count();
            let mut start: Vec<String> = match base.trim_end_matches('+') {
                "crate" => Vec::new(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.clone(),
            };
            for _ in 0..supers {
                start.pop();
            }
            start.extend(rest);
            if let Some(t) = resolve(&start) {
                if &t != module && !t.is_empty() {
                    deps.insert(t);
                }
            }
        }
        edges.insert(module.clone(), deps);
    }
    edges
}

/// The strongly connected sets of more than one file, each sorted, by module path.
fn cycles(src: &Path) -> Vec<Vec<String>> {
    let edges = file_edges(src);
    tarjan(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            names.sort();
            names
        })
        .collect()
}

/// Tarjan's strongly connected components, iteratively.
fn tarjan(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    let nodes: Vec<&Vec<String>> = edges.keys().collect();
    let at: BTreeMap<&Vec<String>, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| edges[*n].iter().filter_map(|d| at.get(d).copied()).collect())
        .collect();
    let (mut index, mut low, mut on) = (
        vec![usize::MAX; nodes.len()],
        vec![0; nodes.len()],
        vec![false; nodes.len()],
    );
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..nodes.len() {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut pos)) = work.last_mut() {
            if *pos == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(*pos) {
                *pos += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

#[test]
fn the_cycle_check_finds_a_cycle_and_resolves_groups() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b::x::Thing, c};\n").unwrap();
    std::fs::write(src.join("b/mod.rs"), "pub mod x;\n").unwrap();
    std::fs::write(
        src.join("b/x.rs"),
        "use super::super::a::Other; // crate::c in a comment\n",
    )
    .unwrap();
    std::fs::write(
        src.join("c.rs"),
        "#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
    )
    .unwrap();
    assert_eq!(cycles(src), vec![vec!["a".to_string(), "b::x".to_string()]]);
    std::fs::write(src.join("b/x.rs"), "pub struct Thing;\n").unwrap();
    assert!(cycles(src).is_empty());
}
