//! A crate's module graph, read from its sources: which modules name which through `crate::`
//! and `super::` paths, and the cycles among them (a module should use only those below it).
//!
//! A module is a file (`a.rs` or `a/mod.rs`); a path `crate::a::b::X` points at the longest
//! module prefix that exists. The `#[cfg(test)] mod tests` block that ends a file is left out
//! (tests may reach anywhere), and so are a module's references to its own submodules (a
//! parent declaring its children is no cycle). Comments count: a doc link upward is an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`""` for the crate root, `steps::plan`) to the modules it names.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

fn module_name(src: &Path, file: &Path) -> String {
    let rel = file
        .strip_prefix(src)
        .expect("below src")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts.join("::")
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("reading the sources")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `a::b::c` paths that follow `prefix` in `text`, `{x, y::z}` groups expanded.
fn paths_after(text: &str, prefix: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !word(c) || c == ':');
        if boundary && after.starts_with('{') {
            let group = &after[1..after.find('}').unwrap_or(after.len())];
            out.extend(
                group
                    .split(',')
                    .map(|p| p.trim().split(" as ").next().unwrap_or("").to_string()),
            );
        } else if boundary {
            let end = after.find(|c: char| !word(c)).unwrap_or(after.len());
            out.push(after[..end].trim_end_matches(':').to_string());
        }
        rest = after;
    }
    out
}

/// The module graph of the crate whose sources are in `src`.
pub fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeMap<String, &std::path::PathBuf> =
        files.iter().map(|f| (module_name(src, f), f)).collect();
    let resolve = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].join("::"))
            .find(|m| modules.contains_key(m))
    };
    let mut graph = Graph::new();
    for (name, file) in &modules {
        let mut text = std::fs::read_to_string(file).expect("reading a source");
        if let Some(at) = text.find("#[cfg(test)]\nmod tests") {
            text.truncate(at);
        }
        let parent = name.rsplit_once("::").map_or("", |(p, _)| p);
        // `super::` of a `mod.rs` file is its parent's parent as well: both name the module above.
        let mut targets: Vec<String> = paths_after(&text, "crate::");
        targets.extend(paths_after(&text, "super::").into_iter().map(|p| {
            if parent.is_empty() {
                p
            } else {
                format!("{parent}::{p}")
            }
        }));
        let edges = graph.entry(name.clone()).or_default();
        for target in targets.iter().filter_map(|t| resolve(t)) {
            let own_child = target.starts_with(&format!("{name}::")) || name.is_empty();
            if target != *name && !target.is_empty() && !own_child {
                edges.insert(target);
            }
        }
    }
    graph
}

/// `graph` with every module folded into its crate-level ancestor (`steps::plan` into
/// `steps`): a directory of modules is one unit, so a circle that passes through different
/// submodules of one (`kubelet` → `parse::yaml` → `stage` → `kubelet`) is a circle here.
/// Edges inside one unit are dropped.
pub fn folded(graph: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or("").to_owned();
    let mut out = Graph::new();
    for (from, targets) in graph {
        let unit = top(from);
        let edges = out.entry(unit.clone()).or_default();
        edges.extend(targets.iter().map(|t| top(t)).filter(|t| *t != unit));
    }
    out
}

/// Every set of two or more modules that name each other in a circle (Tarjan's strongly
/// connected components), each sorted.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(w: &mut Walk<'g>, v: &'g str) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        w.on_stack.insert(v);
        for t in w.graph.get(v).into_iter().flatten() {
            let t = t.as_str();
            if !w.index.contains_key(t) {
                visit(w, t);
                let lt = w.low[t];
                let lv = w.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lt);
            } else if w.on_stack.contains(t) {
                let it = w.index[t];
                let lv = w.low.get_mut(v).expect("visited");
                *lv = (*lv).min(it);
            }
        }
        if w.low[v] == w.index[v] {
            let mut component = Vec::new();
            while let Some(m) = w.stack.pop() {
                w.on_stack.remove(m);
                component.push(m.to_string());
                if m == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                w.found.push(component);
            }
        }
    }
    let mut w = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn folding_finds_a_circle_through_submodules() {
        let graph: Graph = [
            ("kubelet", vec!["parse::yaml"]),
            ("parse::yaml", vec!["stage::units"]),
            ("stage::units", vec![]),
            ("stage", vec!["kubelet"]),
        ]
        .into_iter()
        .map(|(m, t)| (m.to_owned(), t.into_iter().map(str::to_owned).collect()))
        .collect();
        assert!(cycles(&graph).is_empty());
        assert_eq!(
            cycles(&folded(&graph)),
            vec![vec!["kubelet", "parse", "stage"]]
        );
    }

    #[test]
    fn finds_a_cycle_and_leaves_a_line_alone() {
        let line = crate_of(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a.rs", "use crate::b::X;"),
            ("b/mod.rs", "pub mod inner; use crate::c;"),
            ("b/inner.rs", "use super::Y; use crate::c::{Z, W as V};"),
            ("c.rs", "#[cfg(test)]\nmod tests { use crate::a; }"),
        ]);
        assert!(cycles(&graph(line.path())).is_empty());
        let knot = crate_of(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            ("a.rs", "use crate::b::X;"),
            ("b.rs", "/// See [`crate::a::f`]."),
        ]);
        assert_eq!(cycles(&graph(knot.path())), vec![vec!["a", "b"]]);
    }
}
