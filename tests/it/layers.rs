//! The layers of the tree: no two top-level modules of `src/` depend on each other, directly or
//! through others (ARCHITECTURE.md, "Layers"). A module's dependencies are the `crate::X` paths
//! its files name; a cycle among them fails with the modules that form it.
//!
//! Inside `http1/` and `proxy/` the same holds one level down: their submodules form no cycle
//! (a submodule's dependencies are the `crate::M::X` and `super::X` paths that reach a sibling),
//! and the two HTTP/1 roles (`http1::server`, `http1::client`) do not name each other.

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

/// The code of `text`, comment lines left out.
fn code_of(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .flat_map(|line| [line, "\n"])
        .collect()
}

/// The names a path continues with in `rest`: `X` of `X::…`, or each of `{X, Y::…}`.
fn path_heads(rest: &str, named: &mut BTreeSet<String>) {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    if let Some(group) = rest.strip_prefix('{') {
        let inner = &group[..group.find('}').unwrap_or(group.len())];
        for part in inner.split(',') {
            named.insert(word(part.trim()));
        }
    } else {
        named.insert(word(rest));
    }
}

/// The modules named in the code of `text` (comments aside) as `crate::X` or in
/// `crate::{X, Y::…}`.
fn named_modules(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code = code_of(text);
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        path_heads(&code[at + "crate::".len()..], &mut named);
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

/// The submodules of module `parent` (the files and folders of `src/parent/`, without `mod.rs`).
fn submodules(src: &Path, parent: &str) -> BTreeSet<String> {
    let mut found = modules(&src.join(parent));
    found.remove("mod");
    found
}

/// Every `.rs` file of module `parent` with the module path its items live in, from the
/// parent down: `src/proxy/body.rs` is `[proxy, body]`, `src/proxy/upstream/mod.rs`
/// `[proxy, upstream]`, `src/http1/server/head.rs` `[http1, server, head]`.
fn files_with_paths(src: &Path, parent: &str) -> Vec<(PathBuf, Vec<String>)> {
    files_of(src, parent)
        .into_iter()
        .filter(|file| file.starts_with(src.join(parent)))
        .map(|file| {
            let relative = file.strip_prefix(src).unwrap().with_extension("");
            let mut path: Vec<String> = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if path.last().is_some_and(|last| last == "mod") {
                path.pop();
            }
            (file, path)
        })
        .collect()
}

/// The submodules of `parent` that the code of `text` (comments aside) names, for a file whose
/// items live at module path `at`: `crate::parent::X`, `crate::parent::{X, …}`, and
/// `super::X` / `super::super::X` / `super::{X, …}` when the supers climb to `parent` itself.
fn named_siblings(
    text: &str,
    at: &[String],
    parent: &str,
    siblings: &BTreeSet<String>,
) -> BTreeSet<String> {
    let code = code_of(text);
    let mut named = BTreeSet::new();
    let absolute = format!("crate::{parent}::");
    for (found, _) in code.match_indices(&absolute) {
        path_heads(&code[found + absolute.len()..], &mut named);
    }
    for (found, _) in code.match_indices("super::") {
        // Count the whole run of supers once, from its first.
        if code[..found].ends_with("super::") {
            continue;
        }
        let mut rest = &code[found..];
        let mut climbs = 0;
        while let Some(next) = rest.strip_prefix("super::") {
            rest = next;
            climbs += 1;
        }
        if at.len() == climbs + 1 && at[0] == parent {
            path_heads(rest, &mut named);
        }
    }
    named.retain(|m| siblings.contains(m));
    named
}

/// The graph of `parent`'s submodules: each one's siblings named by its files.
fn submodule_graph(src: &Path, parent: &str) -> BTreeMap<String, BTreeSet<String>> {
    let siblings = submodules(src, parent);
    let mut graph: BTreeMap<String, BTreeSet<String>> = siblings
        .iter()
        .map(|s| (s.clone(), BTreeSet::new()))
        .collect();
    for (file, at) in files_with_paths(src, parent) {
        let Some(own) = at.get(1) else {
            continue; // the parent's own mod.rs
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let mut deps = named_siblings(&text, &at, parent, &siblings);
        deps.remove(own);
        graph.get_mut(own).unwrap().extend(deps);
    }
    graph
}

/// Fails with the `what` that form each cycle of `graph`.
fn assert_acyclic(graph: &BTreeMap<String, BTreeSet<String>>, what: &str) {
    let found = cycles(graph);
    assert!(
        found.is_empty(),
        "{what} that depend on each other: {found:?}"
    );
}

#[test]
fn the_http1_roles_name_neither_each_other_nor_anything_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = submodule_graph(&src, "http1");
    assert!(
        graph.contains_key("server") && graph.contains_key("client"),
        "both roles live in http1/: {:?}",
        graph.keys()
    );
    assert!(graph["server"].contains("decode"), "the scan finds uses");
    assert!(
        !graph["server"].contains("client") && !graph["client"].contains("server"),
        "the HTTP/1 roles name each other: server {:?}, client {:?}",
        graph["server"],
        graph["client"]
    );
    assert_acyclic(&graph, "http1 submodules");
}

#[test]
fn no_two_submodules_of_the_proxy_depend_on_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = submodule_graph(&src, "proxy");
    assert!(
        graph["forward"].contains("upstream") && graph["body"].contains("metered"),
        "the scan finds uses: {graph:?}"
    );
    assert_acyclic(&graph, "proxy submodules");
}

#[test]
fn a_sibling_is_found_through_super_and_crate_paths() {
    let siblings: BTreeSet<String> = ["a", "b", "c", "d"].map(String::from).into();
    let at = |path: &[&str]| path.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let text = "use super::a::X;\nuse crate::m::{b, c::Y};\n// use super::d;\n";
    let named = named_siblings(text, &at(&["m", "e"]), "m", &siblings);
    assert_eq!(named, ["a", "b", "c"].map(String::from).into());
    // One level further down, `super::` is the file's own module, not the parent.
    let named = named_siblings("use super::a;", &at(&["m", "e", "f"]), "m", &siblings);
    assert!(named.is_empty());
    let named = named_siblings(
        "use super::super::a;",
        &at(&["m", "e", "f"]),
        "m",
        &siblings,
    );
    assert_eq!(named, ["a"].map(String::from).into());
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
        "HTTP/1 (the codec and both roles, all of src/http1) depends on no module: {:?}",
        graph["http1"]
    );
    assert!(
        graph["websocket"].is_empty(),
        "the WebSocket frame reader is a wire format and depends on no module: {:?}",
        graph["websocket"]
    );
    assert_acyclic(&graph, "modules");
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
