//! The layers of the tree: no two top-level modules of `src/` depend on each other, directly or
//! through others (ARCHITECTURE.md, "Layers"). A module's dependencies are the `crate::X` paths
//! its files name; a cycle among them fails with the modules that form it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules of `src/` (files and folders), without the crate roots.
fn modules(src: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let is_module = path.is_dir() || path.extension().is_some_and(|e| e == "rs");
        if is_module && name != "lib" && name != "main" {
            found.insert(name);
        }
    }
    found
}

/// Every `.rs` file of module `name`: its file and everything under its folder.
fn files_of(src: &Path, name: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let file = src.join(format!("{name}.rs"));
    if file.exists() {
        files.push(file);
    }
    let mut folders = vec![src.join(name)];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The modules named in the code of `text` (comments aside) as `crate::X` or in
/// `crate::{X, Y::…}`.
fn named_modules(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .flat_map(|line| [line, "\n"])
        .collect();
    let text = code.as_str();
    let mut named = BTreeSet::new();
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for part in inner.split(',') {
                named.insert(word(part.trim()));
            }
        } else {
            named.insert(word(rest));
        }
    }
    named.retain(|m| modules.contains(m));
    named
}

/// Strongly connected components of more than one module (Tarjan's algorithm, recursive: a
/// crate has a few dozen modules).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, node: &'a str) {
        let n = walk.index.len();
        walk.index.insert(node, n);
        walk.low.insert(node, n);
        walk.stack.push(node);
        for next in &walk.graph[node] {
            let next = next.as_str();
            if !walk.index.contains_key(next) {
                visit(walk, next);
                let low = walk.low[node].min(walk.low[next]);
                walk.low.insert(node, low);
            } else if walk.stack.contains(&next) {
                let low = walk.low[node].min(walk.index[next]);
                walk.low.insert(node, low);
            }
        }
        if walk.low[node] == walk.index[node] {
            let mut component = Vec::new();
            while let Some(top) = walk.stack.pop() {
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                walk.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            visit(&mut walk, node);
        }
    }
    walk.found
}

#[test]
fn no_two_top_level_modules_depend_on_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    assert!(modules.contains("proxy") && modules.contains("metering"));
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut deps = BTreeSet::new();
        for file in files_of(&src, module) {
            deps.extend(named_modules(
                &std::fs::read_to_string(file).unwrap(),
                &modules,
            ));
        }
        deps.remove(module);
        graph.insert(module.clone(), deps);
    }
    assert!(graph["proxy"].contains("metering"), "the scan finds uses");
    assert!(
        graph["http1"].is_empty(),
        "the HTTP/1 codec is a wire format and depends on no module: {:?}",
        graph["http1"]
    );
    assert!(
        graph["websocket"].is_empty(),
        "the WebSocket frame reader is a wire format and depends on no module: {:?}",
        graph["websocket"]
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "modules that depend on each other: {found:?}"
    );
}

#[test]
fn a_cycle_is_found_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
}
