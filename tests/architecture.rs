//! The module graph of `src/` has no cycle (see ARCHITECTURE.md).
//!
//! Reads every `src/**/*.rs` file, collects the `crate::`, `super::` and `self::` paths of its
//! non-test code (items under `#[cfg(test)]` and `*_tests.rs` files are left out: test helpers may
//! reach anywhere), and checks two graphs for cycles:
//! - top-level modules (`app`, `provision`, `node`, ...), and
//! - within each top-level module, its direct submodules (`provision::plan`, `node::scope`, ...).
//!
//! A fourth test keeps every non-test source file at 1,100 lines or fewer.
//!
//! Run them alone with `cargo test --test architecture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module path inside the crate, e.g. `["provision", "controller", "cleanup"]`.
type ModPath = Vec<String>;

#[test]
fn no_import_cycle_between_top_level_modules() {
    let edges = edges();
    let graph = graph(&edges, |path| path.first().cloned());
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules:\n{}",
        show(&cycles, &edges)
    );
}

#[test]
fn no_import_cycle_between_submodules() {
    let edges = edges();
    let tops: BTreeSet<String> = edges
        .keys()
        .filter_map(|from| from.first().cloned())
        .collect();
    let mut found = Vec::new();
    for top in tops {
        // Only edges that stay inside `top`; submodule = the second segment (or `top` itself).
        let inner: BTreeMap<ModPath, BTreeSet<ModPath>> = edges
            .iter()
            .filter(|(from, _)| from.first() == Some(&top))
            .map(|(from, tos)| {
                (
                    from.clone(),
                    tos.iter()
                        .filter(|to| to.first() == Some(&top))
                        .cloned()
                        .collect(),
                )
            })
            .collect();
        let graph = graph(&inner, |path| {
            Some(path.iter().take(2).cloned().collect::<Vec<_>>().join("::"))
        });
        found.extend(cycles(&graph));
    }
    assert!(
        found.is_empty(),
        "import cycles between submodules:\n{}",
        show(&found, &edges)
    );
}

#[test]
fn the_checker_sees_real_imports() {
    // Guards the parser itself: a check that finds no edge at all could never fail.
    let edges = edges();
    let provision_plan = vec!["provision".to_owned(), "plan".to_owned()];
    let uses = edges
        .get(&provision_plan)
        .expect("src/provision/plan.rs is parsed");
    assert!(
        uses.iter()
            .any(|to| to.first().is_some_and(|top| top == "names")),
        "{uses:?}"
    );
    let graph = graph(
        &BTreeMap::from([
            (vec!["a".into()], BTreeSet::from([vec!["b".into()]])),
            (vec!["b".into()], BTreeSet::from([vec!["a".into()]])),
        ]),
        |p| p.first().cloned(),
    );
    assert_eq!(cycles(&graph).len(), 1);
}

#[test]
fn no_source_file_outside_tests_is_over_1100_lines() {
    // Files are split by concept, not by length (issue 40: one concept, one home); a file
    // longer than this has grown a second concept that wants its own. Unit tests live beside
    // their module in `*_tests.rs`.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = rust_files(&src)
        .into_iter()
        .filter(|file| !file.to_string_lossy().ends_with("_tests.rs"))
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            (lines > 1100).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these files: {long:?}");
}

/// One layout (ARCHITECTURE.md "Layout"): a folder's module is `foo.rs` beside `foo/`, and
/// `#[path]` only includes a file's tests (`x_tests.rs`, `x_props_tests.rs`) beside it.
#[test]
fn one_module_convention_and_path_only_for_test_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in rust_files(&root) {
        let relative = file.strip_prefix(&root).unwrap().display().to_string();
        if file.file_name().is_some_and(|n| n == "mod.rs") {
            wrong.push(format!(
                "{relative}: a mod.rs (use the folder's name .rs beside it)"
            ));
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Tests are placed one way, in `*_tests.rs` beside their module; telemetry.rs keeps its
        // inline, since its `--vmodule` test matches the call sites' file name.
        if relative != "telemetry.rs" && text.lines().any(|l| l.trim() == "mod tests {") {
            wrong.push(format!(
                "{relative}: inline tests (move them to a *_tests.rs file beside it)"
            ));
        }
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("#[path"))
        {
            if !line.contains("_tests.rs\"]") {
                wrong.push(format!("{relative}: {}", line.trim()));
            }
        }
    }
    assert!(wrong.is_empty(), "layout:\n{}", wrong.join("\n"));
}

#[test]
fn the_architecture_module_table_names_every_top_level_module_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|line| line.trim().strip_suffix(';'))
        .filter_map(|line| line.rsplit_once("mod ").map(|(_, name)| name.to_owned()))
        .filter(|name| name != "testing")
        .collect();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("## Modules")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("ARCHITECTURE.md has a \"Modules\" section");
    // First column of each table row; submodules are named in parentheses after their module.
    let named: BTreeSet<String> = section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .filter_map(|line| line.split('|').nth(1))
        .flat_map(|cell| {
            let mut depth = 0;
            let mut out = Vec::new();
            for (i, part) in cell.split('`').enumerate() {
                if i % 2 == 1 && depth == 0 {
                    out.push(part.to_owned());
                } else {
                    depth += part.matches('(').count();
                    depth -= part.matches(')').count().min(depth);
                }
            }
            out
        })
        .collect();
    assert_eq!(
        named, declared,
        "ARCHITECTURE.md's module table against src/lib.rs"
    );
}

/// Module -> the modules its non-test code names.
fn edges() -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges = BTreeMap::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).unwrap();
        let Some(module) = module_of(relative) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        let mut collector = Collector {
            module: module.clone(),
            inline: Vec::new(),
            found: BTreeSet::new(),
        };
        collector.visit_file(&parsed);
        edges
            .entry(module)
            .or_insert_with(BTreeSet::new)
            .extend(collector.found);
    }
    edges
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// `provision/plan.rs` -> `provision::plan`; `node/mod.rs` -> `node`; test-only files -> None.
fn module_of(relative: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    let last = parts.last()?.clone();
    if last.ends_with("_tests") || last == "testing" || last == "main" {
        return None;
    }
    if last == "mod" || last == "lib" {
        parts.pop();
    }
    Some(parts)
}

struct Collector {
    /// The file's module.
    module: ModPath,
    /// Inline `mod x { .. }` blocks we are inside of.
    inline: Vec<String>,
    found: BTreeSet<ModPath>,
}

impl Collector {
    fn here(&self) -> ModPath {
        self.module.iter().chain(&self.inline).cloned().collect()
    }

    /// Resolves a path's leading segments to a module path, if it names one inside the crate.
    fn record(&mut self, segments: &[String]) {
        let mut resolved = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super" | "self") => self.here(),
            _ => return,
        };
        for segment in segments {
            match segment.as_str() {
                "crate" | "self" => {}
                "super" => {
                    resolved.pop();
                }
                // Modules are snake_case; the first other segment ends the module part.
                name if name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') =>
                {
                    resolved.push(name.to_owned());
                }
                _ => break,
            }
        }
        if !resolved.is_empty() {
            self.found.insert(resolved);
        }
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .meta
                .require_list()
                .is_ok_and(|list| list.tokens.to_string().contains("test"))
    })
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(item) => &item.attrs,
            syn::Item::Fn(item) => &item.attrs,
            syn::Item::Use(item) => &item.attrs,
            syn::Item::Impl(item) => &item.attrs,
            syn::Item::Const(item) => &item.attrs,
            syn::Item::Static(item) => &item.attrs,
            syn::Item::Struct(item) => &item.attrs,
            syn::Item::Enum(item) => &item.attrs,
            _ => &[],
        };
        if !is_cfg_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.inline.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.inline.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut prefixes = Vec::new();
        use_paths(&item.tree, &mut Vec::new(), &mut prefixes);
        for path in prefixes {
            self.record(&path);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // Paths inside macro arguments (`format!("{}", crate::x::y())`) are plain tokens: scan them.
        let tokens: Vec<proc_macro2::TokenTree> = mac.tokens.clone().into_iter().collect();
        scan_tokens(&tokens, self);
        syn::visit::visit_macro(self, mac);
    }
}

fn scan_tokens(tokens: &[proc_macro2::TokenTree], collector: &mut Collector) {
    use proc_macro2::TokenTree;
    let mut index = 0;
    while index < tokens.len() {
        match &tokens[index] {
            TokenTree::Group(group) => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                scan_tokens(&inner, collector);
            }
            TokenTree::Ident(ident) if ident == "crate" || ident == "super" => {
                let mut segments = vec![ident.to_string()];
                let mut next = index + 1;
                // `::` is two `:` puncts followed by an identifier.
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(name)),
                ) = (tokens.get(next), tokens.get(next + 1), tokens.get(next + 2))
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    segments.push(name.to_string());
                    next += 3;
                }
                collector.record(&segments);
                index = next;
                continue;
            }
            _ => {}
        }
        index += 1;
    }
}

/// Every path a `use` tree names, as segments (`use crate::{a, b::c}` -> `crate::a`, `crate::b::c`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_paths(&path.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) => out.push(
            prefix
                .iter()
                .cloned()
                .chain([name.ident.to_string()])
                .collect(),
        ),
        syn::UseTree::Rename(rename) => out.push(
            prefix
                .iter()
                .cloned()
                .chain([rename.ident.to_string()])
                .collect(),
        ),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(group) => {
            for item in &group.items {
                use_paths(item, prefix, out);
            }
        }
    }
}

/// Collapses module paths to graph nodes (`node_of` returns None to leave a path out).
fn graph(
    edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
    node_of: impl Fn(&ModPath) -> Option<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in edges {
        let Some(from) = node_of(from) else { continue };
        let targets = graph.entry(from.clone()).or_default();
        for to in tos {
            if let Some(to) = node_of(to)
                && to != from
            {
                targets.insert(to);
            }
        }
    }
    graph
}

/// The strongly connected components with more than one node (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a str) {
        let next = state.index.len();
        state.index.insert(node, next);
        state.low.insert(node, next);
        state.stack.push(node);
        state.on_stack.insert(node);
        for to in state.graph.get(node).into_iter().flatten() {
            if !state.index.contains_key(to.as_str()) {
                visit(state, to);
                let low = state.low[node].min(state.low[to.as_str()]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(to.as_str()) {
                let low = state.low[node].min(state.index[to.as_str()]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack.remove(top);
                component.push(top.to_owned());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found
}

/// Each cycle with the file-level imports that make it, so the message says what to move.
fn show(cycles: &[Vec<String>], edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> String {
    let mut out = String::new();
    for cycle in cycles {
        out.push_str(&format!("cycle: {}\n", cycle.join(" <-> ")));
        for (from, tos) in edges {
            let from_name = from.join("::");
            if !cycle
                .iter()
                .any(|node| from_name == *node || from_name.starts_with(&format!("{node}::")))
            {
                continue;
            }
            for to in tos {
                let to_name = to.join("::");
                let inside = |name: &str, node: &String| {
                    name == node || name.starts_with(&format!("{node}::"))
                };
                let from_node = cycle.iter().find(|node| inside(&from_name, node));
                let to_node = cycle.iter().find(|node| inside(&to_name, node));
                if let (Some(a), Some(b)) = (from_node, to_node)
                    && a != b
                {
                    out.push_str(&format!("  {from_name} uses {to_name}\n"));
                }
            }
        }
    }
    out
}
