//! The layout is the architecture (issue #46): the top-level modules of `src/` call each other
//! without a cycle, and each calls exactly the modules docs/ARCHITECTURE.md's code map says it
//! may call. Read from the source itself: a `crate::` path outside comments and test modules
//! is a call.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Module name → the modules its (non-test) code names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The top-level module a path under `src/` belongs to; `main.rs` is the binary, counted with
/// `cli` as the code map does. `None` for the crate root and test-only modules.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    match name {
        "lib" | "fuzz" => None,
        "main" => Some("cli".into()),
        other => Some(other.into()),
    }
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The code of a file without its comments and its test modules (which, in this codebase, end
/// the file).
fn production_code(text: &str) -> String {
    let end = text
        .match_indices("#[cfg(test)]\nmod ")
        .find(|(at, _)| text[*at..].lines().nth(1).is_some_and(|line| line.trim_end().ends_with('{')))
        .map_or(text.len(), |(at, _)| at);
    text[..end].lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The files of submodules declared test-only (`#[cfg(test)] mod model;`) in `file`.
fn test_only_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let dir = if file.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs") {
        file.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        file.with_extension("")
    };
    text.match_indices("#[cfg(test)]\nmod ")
        .filter_map(|(at, found)| text[at + found.len()..].split_once(';').map(|(name, _)| name.trim().to_owned()))
        .filter(|name| name.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .map(|name| dir.join(format!("{name}.rs")))
        .collect()
}

/// The top-level module names a piece of code reaches through `prefix` (`crate::` in the
/// library, `haptic::` in the binary), grouped imports included.
fn named_modules(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |text: &str| text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b, c::{..}}`: the names at the group's first level.
            let (mut depth, mut start) = (0usize, true);
            for (index, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        names.insert(ident(&group[index..]));
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names
}

fn import_graph() -> Graph {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let test_only: BTreeSet<PathBuf> = files
        .iter()
        .flat_map(|file| test_only_files(file, &fs::read_to_string(file).expect("source is readable")))
        .collect();
    files.retain(|file| !test_only.contains(file));
    let modules: BTreeSet<String> =
        files.iter().filter_map(|f| module_of(f.strip_prefix(&src).expect("under src"))).collect();
    let mut graph: Graph = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(relative) else { continue };
        let code = production_code(&fs::read_to_string(file).expect("source is readable"));
        let prefix = if relative == Path::new("main.rs") { "haptic::" } else { "crate::" };
        let called = named_modules(&code, prefix).into_iter().filter(|m| modules.contains(m) && *m != module);
        graph.get_mut(&module).expect("known module").extend(called);
    }
    graph
}

/// A cycle through `start`, if there is one.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(graph: &Graph, start: &str, path: &mut Vec<String>, seen: &mut BTreeSet<String>) -> bool {
        let here = path.last().expect("path starts at start").clone();
        for next in &graph[&here] {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    walk(graph, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn the_top_level_modules_import_each_other_without_a_cycle() {
    let graph = import_graph();
    assert!(graph.len() > 10, "the modules were not found: {graph:?}");
    let cycles: Vec<String> = graph.keys().filter_map(|m| cycle_from(&graph, m)).map(|c| c.join(" → ")).collect();
    assert!(cycles.is_empty(), "import cycles between top-level modules:\n{}", cycles.join("\n"));
}

/// The code map's rows: each module named in a row's first cell, with the modules its "May
/// call" cell names in backticks.
fn documented_calls(modules: &BTreeSet<String>) -> Graph {
    let text = fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let map = text.split("## Code map").nth(1).expect("a Code map section");
    let map = map.split("\n## ").next().unwrap_or(map).split("Outside `src/`").next().unwrap_or(map);
    let mut documented = Graph::new();
    for row in map.lines().filter(|line| line.starts_with("| `src/")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert!(cells.len() >= 3, "a code map row without a May call cell: {row}");
        let backticked =
            |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
        let may_call: BTreeSet<String> = backticked(cells[2])
            .into_iter()
            .map(|name| name.split("::").next().unwrap_or_default().to_owned())
            .filter(|name| modules.contains(name))
            .collect();
        for path in backticked(cells[0].trim_start_matches("| ")) {
            let relative = path.trim_start_matches("src/").trim_end_matches('/');
            if let Some(module) = module_of(Path::new(relative)) {
                documented.entry(module).or_default().extend(may_call.iter().cloned());
            }
        }
    }
    documented
}

#[test]
fn each_module_calls_what_architecture_md_says_it_may_call() {
    let graph = import_graph();
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    let documented = documented_calls(&modules);
    let mut wrong = Vec::new();
    for (module, calls) in &graph {
        let Some(allowed) = documented.get(module) else {
            wrong.push(format!("{module}: no row in the code map"));
            continue;
        };
        let undocumented: Vec<_> = calls.difference(allowed).collect();
        let unused: Vec<_> = allowed.difference(calls).collect();
        if !undocumented.is_empty() {
            wrong.push(format!("{module} calls {undocumented:?}, which its May call cell does not name"));
        }
        if !unused.is_empty() {
            wrong.push(format!("{module}'s May call cell names {unused:?}, which it does not call"));
        }
    }
    assert!(wrong.is_empty(), "docs/ARCHITECTURE.md's code map is not the code:\n{}", wrong.join("\n"));
}

#[test]
fn the_reader_finds_imports_in_every_form() {
    let code = "use crate::{config::X, store::{A, B},\n    files};\nlet x = crate::plan::plan(a);\nmy_crate::no;";
    let names: Vec<_> = named_modules(code, "crate::").into_iter().collect();
    assert_eq!(names, ["config", "files", "plan", "store"]);
    let code = "fn a() {}\n// crate::journal in a comment\n#[cfg(test)]\nmod tests {\n    use crate::fleet;\n}\n";
    assert!(named_modules(&production_code(code), "crate::").is_empty());
}
