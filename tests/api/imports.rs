//! No loop of imports between the files of `src/`, of any length: a file that imports
//! another (a `crate::…` or `super::…` path outside its `#[cfg(test)]` module, mapped to the
//! file of the longest module it names) never reaches itself again. Pairs are not enough: a
//! loop of nine files is still a loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every file under `src`, by the module path it defines.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["lib"] || parts == ["main"] {
                parts.clear();
            }
            found.insert(parts, path);
        }
    }
    found
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths rooted at `crate` or `super` in `text`: how many levels `super` climbs (`None`
/// for `crate`), the segments after the root, and the names a `{…}` group lists last.
fn paths(text: &str) -> Vec<(Option<usize>, Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find(['c', 's']) {
        let start = at + offset;
        at = start + 1;
        if text[..start].chars().next_back().is_some_and(is_word) {
            continue;
        }
        let rest = &text[start..];
        let (mut climbs, mut tail) = if let Some(t) = rest.strip_prefix("crate::") {
            (None, t)
        } else if let Some(t) = rest.strip_prefix("super::") {
            (Some(1), t)
        } else {
            continue;
        };
        while let Some(t) = tail.strip_prefix("super::") {
            climbs = climbs.map(|n| n + 1);
            tail = t;
        }
        let mut segments = Vec::new();
        let mut names = Vec::new();
        loop {
            if let Some(group) = tail.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                names = group[..end]
                    .split(',')
                    .filter_map(|t| t.trim().split("::").next())
                    .map(str::to_owned)
                    .collect();
                break;
            }
            let word: String = tail.chars().take_while(|c| is_word(*c)).collect();
            if word.is_empty() {
                break;
            }
            tail = &tail[word.len()..];
            segments.push(word);
            match tail.strip_prefix("::") {
                Some(t) => tail = t,
                None => break,
            }
        }
        if !segments.is_empty() || !names.is_empty() {
            found.push((climbs, segments, names));
        }
    }
    found
}

/// The longest module of `files` that `segments` starts with.
fn resolve(files: &BTreeMap<Module, PathBuf>, segments: &[String]) -> Option<Module> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].to_vec())
        .find(|m| files.contains_key(m))
}

fn edges(files: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges = BTreeMap::new();
    for (module, path) in files {
        let text = std::fs::read_to_string(path).expect("read source");
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        let text: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut to = BTreeSet::new();
        for (climbs, segments, names) in paths(&text) {
            let mut base: Module = match climbs {
                None => Vec::new(),
                Some(n) => module[..module.len().saturating_sub(n)].to_vec(),
            };
            base.extend(segments);
            let targets: Vec<Module> = if names.is_empty() {
                vec![base]
            } else {
                names
                    .iter()
                    .map(|n| {
                        let mut m = base.clone();
                        if n != "self" && !n.is_empty() {
                            m.push(n.clone());
                        }
                        m
                    })
                    .collect()
            };
            for target in targets {
                if let Some(t) = resolve(files, &target).filter(|t| t != module) {
                    to.insert(t);
                }
            }
        }
        edges.insert(module.clone(), to);
    }
    edges
}

/// The sets of modules that reach each other (Tarjan), those of more than one module.
fn loops(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a Module) {
        let n = w.index.len();
        w.index.insert(v, (n, n));
        w.stack.push(v);
        for t in &w.edges[v] {
            let low = match w.index.get(t) {
                None => {
                    visit(w, t);
                    w.index[t].1
                }
                Some(&(i, _)) if w.stack.contains(&t) => i,
                Some(_) => continue,
            };
            let entry = w.index.get_mut(v).expect("visited");
            entry.1 = entry.1.min(low);
        }
        if w.index[v].0 == w.index[v].1 {
            let mut set = Vec::new();
            while let Some(m) = w.stack.pop() {
                set.push(m.clone());
                if m == v {
                    break;
                }
            }
            if set.len() > 1 {
                w.found.push(set);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.found
}

#[test]
fn no_file_under_src_reaches_itself_through_its_imports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    assert!(files.len() > 50, "found the sources: {}", files.len());
    let loops = loops(&edges(&files));
    let shown: Vec<Vec<String>> = loops
        .iter()
        .map(|set| set.iter().map(|m| files[m].display().to_string()).collect())
        .collect();
    assert!(shown.is_empty(), "import loops: {shown:#?}");
}

/// The check itself finds a loop of three and one through `super::`, and not a child
/// naming its parent.
#[test]
fn the_check_finds_loops_of_any_length() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        std::fs::write(path, text).expect("write");
    };
    write("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;");
    write("a.rs", "use crate::b::B;");
    write("b.rs", "use crate::{c::C, x};");
    write("c.rs", "fn f() { crate::a::g() }");
    write(
        "d/mod.rs",
        "mod e; use crate::a; // crate::d::e::E in a comment",
    );
    write("d/e.rs", "use super::super::d::E;");
    let files = modules(dir.path());
    let found = loops(&edges(&files));
    let names: Vec<Vec<String>> = found
        .iter()
        .map(|set| {
            let mut names: Vec<String> = set.iter().map(|m| m.join("::")).collect();
            names.sort();
            names
        })
        .collect();
    assert_eq!(names, [["a", "b", "c"]], "{names:?}");

    write("d/mod.rs", "mod e; use e::E; use crate::d::e::F;");
    let found = loops(&edges(&modules(dir.path())));
    assert_eq!(
        found.len(),
        2,
        "d ↔ d::e through super::super::d: {found:?}"
    );
}

/// The HTTP room is a leaf: only its own files and start-up (which mounts it) import
/// `routes`; use cases live in their feature rooms, and the console calls those.
#[test]
fn nothing_outside_the_http_room_and_start_up_imports_routes() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let routes = vec!["routes".to_string()];
    assert!(files.contains_key(&routes), "found the HTTP room");
    let importers: Vec<String> = edges(&files)
        .into_iter()
        .filter(|(module, to)| {
            let inside = module
                .first()
                .is_some_and(|m| m == "routes" || m == "startup");
            !inside && to.iter().any(|t| t.first() == Some(&routes[0]))
        })
        .map(|(module, _)| files[&module].display().to_string())
        .collect();
    assert!(importers.is_empty(), "import `routes`: {importers:#?}");
}
