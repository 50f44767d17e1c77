//! What templates and predicates read.
//!
//! A template (minijinja) or predicate (CEL) may read `inputs`, declared
//! `state`, and `steps.<id>.output` / `steps.<id>.status`. This module
//! compiles each one and extracts the variable paths it reads (`["steps",
//! "fetch", "output"]`); the validator then checks each path against the
//! workflow. Nothing is rendered or evaluated.
//!
//! Templates of the common simple shape — text with `{{ a.b.c }}`
//! substitutions and nothing else — are read by a small exact scanner;
//! anything else goes through minijinja's parser
//! (`Template::undeclared_variables`). Predicates are compiled with the
//! `cel` crate and their syntax tree walked, tracking comprehension
//! variables, so that every function called is known.

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

/// The roots a template or predicate may start a path with.
pub const ROOTS: [&str; 3] = ["inputs", "state", "steps"];

/// minijinja's global functions that are pure and allowed in templates.
pub const TEMPLATE_GLOBALS: [&str; 3] = ["range", "dict", "namespace"];

/// The CEL functions and operators a predicate may call: CEL's standard
/// definitions, all of them pure functions of their arguments. Nothing here
/// reads a clock, the environment or randomness; anything not listed is
/// rejected at load.
pub const PURE_CEL_FUNCTIONS: &[&str] = &[
    // operators
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "-_",
    "!_",
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_&&_",
    "_||_",
    "_?_:_",
    "_[_]",
    "_[?_]",
    "_?._",
    "@in",
    "@not_strictly_false",
    // conversions and type
    "bool",
    "bytes",
    "double",
    "duration",
    "dyn",
    "int",
    "string",
    "timestamp",
    "type",
    "uint",
    // strings, lists, maps
    "contains",
    "endsWith",
    "matches",
    "size",
    "startsWith",
    // timestamp and duration accessors (pure functions of their argument)
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getMonth",
    "getSeconds",
    // optionals
    "hasValue",
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
    "or",
    "orValue",
    "value",
];

/// What one template or predicate reads, or why it does not compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reads {
    /// Variable paths read, sorted and deduplicated. A path of one segment
    /// (`steps`) is a whole root; `steps.x` with a non-literal index shows up
    /// as the bare root.
    pub paths: Vec<Vec<String>>,
    /// Functions called (predicates only), sorted and deduplicated.
    pub functions: Vec<String>,
    /// Levels of the expression tree (predicates only; 0 for templates).
    /// A predicate deeper than the reader's bound reads nothing: it is not
    /// walked, only refused.
    pub depth: usize,
    /// Most macros (comprehensions) nested in one another's bodies
    /// (predicates only).
    pub loops: usize,
}

/// Compiles templates and predicates, each distinct text once.
pub(crate) struct Reader {
    env: minijinja::Environment<'static>,
    templates: HashMap<String, Result<Reads, String>>,
    predicates: HashMap<String, Result<Reads, String>>,
}

impl Reader {
    pub(crate) fn new() -> Self {
        Reader {
            env: minijinja::Environment::new(),
            templates: HashMap::new(),
            predicates: HashMap::new(),
        }
    }

    /// What a template reads, or its syntax error.
    pub(crate) fn template(&mut self, src: &str) -> Result<Reads, String> {
        if let Some(r) = self.templates.get(src) {
            return r.clone();
        }
        let r = match scan_simple(src) {
            Some(paths) => Ok(Reads {
                paths,
                functions: Vec::new(),
                depth: 0,
                loops: 0,
            }),
            None => self.template_slow(src),
        };
        self.templates.insert(src.to_owned(), r.clone());
        r
    }

    fn template_slow(&self, src: &str) -> Result<Reads, String> {
        let t = self.env.template_from_str(src).map_err(|e| e.to_string())?;
        let mut paths: Vec<Vec<String>> = t
            .undeclared_variables(true)
            .into_iter()
            .map(|v| v.split('.').map(str::to_owned).collect())
            .collect();
        paths.sort();
        paths.dedup();
        Ok(Reads {
            paths,
            functions: Vec::new(),
            depth: 0,
            loops: 0,
        })
    }

    /// Calls `f` with every variable path a template reads (possibly more
    /// than once), or returns its syntax error. Simple templates are read
    /// without allocating; others are compiled once per distinct text.
    pub(crate) fn template_paths(
        &mut self,
        src: &str,
        mut f: impl FnMut(&[&str]),
    ) -> Result<(), String> {
        if scan_simple_with(src, &mut f) {
            return Ok(());
        }
        let reads = self.template(src)?;
        for p in &reads.paths {
            let segs: Vec<&str> = p.iter().map(String::as_str).collect();
            f(&segs);
        }
        Ok(())
    }

    /// What a predicate reads and calls, or its compile error. A predicate
    /// deeper than `max_depth` is measured, not walked (the walk recurses);
    /// one whose text chains more than [`CHAINS_PER_LEVEL`] × `max_depth`
    /// operators is not even compiled (the CEL parser recurses once per
    /// chained operator), and its depth is given as that count.
    pub(crate) fn predicate(&mut self, src: &str, max_depth: usize) -> Result<Reads, String> {
        if let Some(r) = self.predicates.get(src) {
            return r.clone();
        }
        let chained = chained_operators(src);
        if chained > max_depth.saturating_mul(CHAINS_PER_LEVEL) {
            return Ok(Reads {
                paths: Vec::new(),
                functions: Vec::new(),
                depth: chained,
                loops: 0,
            });
        }
        let r = match cel::Program::compile(src) {
            Err(e) => Err(e.to_string()),
            Ok(p) => {
                let (depth, loops) = depth(p.expression());
                if depth > max_depth {
                    Ok(Reads {
                        paths: Vec::new(),
                        functions: Vec::new(),
                        depth,
                        loops,
                    })
                } else {
                    let mut w = Walk {
                        bound: Vec::new(),
                        paths: Vec::new(),
                        functions: Vec::new(),
                    };
                    w.expr(p.expression());
                    w.paths.sort();
                    w.paths.dedup();
                    w.functions.sort();
                    w.functions.dedup();
                    Ok(Reads {
                        paths: w.paths,
                        functions: w.functions,
                        depth,
                        loops,
                    })
                }
            }
        };
        self.predicates.insert(src.to_owned(), r.clone());
        r
    }
}

/// [`scan_simple`] without allocating: calls `f` per path and returns
/// `true`, or returns `false` (having called nothing) when the template is
/// not simple.
pub(crate) fn scan_simple_with(src: &str, f: &mut impl FnMut(&[&str])) -> bool {
    const MAX_SEGMENTS: usize = 16;
    if src.contains("{%") || src.contains("{#") {
        return false;
    }
    // Check first, then report: nothing is reported for a template that
    // turns out not to be simple.
    for pass in 0..2 {
        let mut rest = src;
        while let Some(open) = rest.find("{{") {
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return false;
            };
            let inner = after[..close].trim_matches(|c: char| c == ' ' || c == '\t');
            let mut segs: [&str; MAX_SEGMENTS] = [""; MAX_SEGMENTS];
            let mut n = 0;
            for seg in inner.split('.') {
                if n == MAX_SEGMENTS || !is_ident(seg) {
                    return false;
                }
                segs[n] = seg;
                n += 1;
            }
            if !ROOTS.contains(&segs[0]) {
                return false;
            }
            if pass == 1 {
                f(&segs[..n]);
            }
            rest = &after[close + 2..];
        }
    }
    true
}

/// Reads templates made only of text and `{{ root.a.b }}` substitutions
/// whose root is one of [`ROOTS`]; `None` for anything else (left to
/// minijinja). Exact for what it accepts: such a template always compiles,
/// and reads exactly these paths.
pub(crate) fn scan_simple(src: &str) -> Option<Vec<Vec<String>>> {
    let mut paths: Vec<Vec<String>> = Vec::new();
    let simple = scan_simple_with(src, &mut |p: &[&str]| {
        paths.push(p.iter().map(|s| (*s).to_owned()).collect())
    });
    if !simple {
        return None;
    }
    paths.sort();
    paths.dedup();
    Some(paths)
}

/// How many chained operators a predicate may have per level of its depth
/// limit before it is refused without being compiled: a long predicate of
/// shallow clauses (`a.x == 1 && a.y == 2 && …`) spends several per level.
pub(crate) const CHAINS_PER_LEVEL: usize = 8;

/// An upper bound on the operators a predicate chains, from its text alone:
/// every operator character, opening bracket, `.` before a name and `in`
/// outside string and bytes literals. The CEL parser builds (and recurses
/// over) one level per chained binary operator, member access, index or
/// call, so this bounds its recursion before it runs.
fn chained_operators(src: &str) -> usize {
    let b = src.as_bytes();
    let mut n = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                // A literal: skip to its closing quote (three for a
                // triple-quoted one), stepping over escapes.
                let closing = [q, q, q];
                let triple = b.get(i..i + 3) == Some(&closing[..]);
                i += if triple { 3 } else { 1 };
                while i < b.len() {
                    if b[i] == b'\\' {
                        i += 2;
                    } else if triple && b.get(i..i + 3) == Some(&closing[..]) {
                        i += 3;
                        break;
                    } else if !triple && b[i] == q {
                        i += 1;
                        break;
                    } else {
                        i += 1;
                    }
                }
                continue;
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'<' | b'>' | b'=' | b'!' | b'&' | b'|' | b'?'
            | b':' | b'[' | b'(' | b'{' => n += 1,
            b'.' if b
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') =>
            {
                n += 1
            }
            b'i' if b.get(i + 1) == Some(&b'n')
                && (i == 0 || !is_word(b[i - 1]))
                && !b.get(i + 2).is_some_and(|c| is_word(*c)) =>
            {
                n += 1
            }
            _ => {}
        }
        i += 1;
    }
    n
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Levels of an expression tree, and the most comprehensions nested in one
/// another's bodies (their condition and step, which run per element),
/// counted without recursion (the tree may be thousands of levels deep).
fn depth(root: &IdedExpr) -> (usize, usize) {
    let (mut deepest, mut most_loops) = (0, 0);
    let mut pending = vec![(root, 1, 0)];
    while let Some((e, d, loops)) = pending.pop() {
        deepest = deepest.max(d);
        if let Expr::Comprehension(c) = &e.expr {
            most_loops = most_loops.max(loops + 1);
            pending.extend([&c.iter_range, &c.accu_init, &c.result].map(|x| (x, d + 1, loops)));
            pending.extend([&c.loop_cond, &c.loop_step].map(|x| (x, d + 1, loops + 1)));
        } else {
            pending.extend(children(e).into_iter().map(|c| (c, d + 1, loops)));
        }
    }
    (deepest, most_loops)
}

fn entry_children(x: &EntryExpr) -> [&IdedExpr; 2] {
    match x {
        EntryExpr::StructField(f) => [&f.value, &f.value],
        EntryExpr::MapEntry(m) => [&m.key, &m.value],
    }
}

/// The expressions directly inside `e` (a struct field's value twice, which
/// does not change a depth).
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => Vec::new(),
        Expr::Select(sel) => vec![&sel.operand],
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(&call.args)
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|x| entry_children(&x.expr))
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|x| entry_children(&x.expr))
            .collect(),
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

struct Walk {
    /// Comprehension variables in scope.
    bound: Vec<String>,
    paths: Vec<Vec<String>>,
    functions: Vec<String>,
}

impl Walk {
    /// The variable path an expression spells (`a.b["c"].d`), if it is one.
    fn chain(&self, e: &IdedExpr) -> Option<Vec<String>> {
        match &e.expr {
            Expr::Ident(name) => {
                if self.bound.iter().any(|b| b == name) {
                    None
                } else {
                    Some(vec![name.clone()])
                }
            }
            Expr::Select(sel) => {
                let mut p = self.chain(&sel.operand)?;
                p.push(sel.field.clone());
                Some(p)
            }
            Expr::Call(call)
                if call.func_name == "_[_]" && call.target.is_none() && call.args.len() == 2 =>
            {
                let Expr::Literal(LiteralValue::String(key)) = &call.args[1].expr else {
                    return None;
                };
                let mut p = self.chain(&call.args[0])?;
                p.push(key.to_string());
                Some(p)
            }
            _ => None,
        }
    }

    fn expr(&mut self, e: &IdedExpr) {
        if let Some(p) = self.chain(e) {
            self.paths.push(p);
            return;
        }
        match &e.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Ident(_) => {} // a bound comprehension variable
            Expr::Select(sel) => self.expr(&sel.operand),
            Expr::Call(call) => {
                self.functions.push(call.func_name.clone());
                if let Some(t) = &call.target {
                    self.expr(t);
                }
                for a in &call.args {
                    self.expr(a);
                }
            }
            Expr::Comprehension(c) => {
                self.expr(&c.iter_range);
                self.expr(&c.accu_init);
                let before = self.bound.len();
                self.bound.push(c.iter_var.clone());
                if let Some(v2) = &c.iter_var2 {
                    self.bound.push(v2.clone());
                }
                self.bound.push(c.accu_var.clone());
                self.expr(&c.loop_cond);
                self.expr(&c.loop_step);
                self.expr(&c.result);
                self.bound.truncate(before);
            }
            Expr::List(l) => l.elements.iter().for_each(|x| self.expr(x)),
            Expr::Map(m) => {
                for entry in &m.entries {
                    self.entry(&entry.expr);
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    self.entry(&entry.expr);
                }
            }
        }
    }

    fn entry(&mut self, e: &EntryExpr) {
        match e {
            EntryExpr::StructField(f) => self.expr(&f.value),
            EntryExpr::MapEntry(m) => {
                self.expr(&m.key);
                self.expr(&m.value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(r: &Reads) -> Vec<String> {
        r.paths.iter().map(|p| p.join(".")).collect()
    }

    #[test]
    fn simple_scanner_agrees_with_minijinja() {
        let r = Reader::new();
        for src in [
            "plain text",
            "Summarize {{ steps.fetch.output }} for {{inputs.user}} {",
            "{{ state.notes }} and }} {{ inputs }}",
            "x {{ steps.a.output.items }} y {{ steps.a.output.items }}",
        ] {
            let fast = scan_simple(src).expect("simple");
            let slow = r.template_slow(src).expect("compiles");
            assert_eq!(fast, slow.paths, "{src}");
        }
        for src in [
            "{% if x %}{% endif %}",
            "{{ range(3) }}",
            "{{ steps['a'].output }}",
            "{{- inputs.x }}",
            "{{ inputs.x",
        ] {
            assert_eq!(scan_simple(src), None, "{src}");
        }
    }

    #[test]
    fn predicates_report_paths_functions_and_skip_comprehension_variables() {
        let mut r = Reader::new();
        let reads = r
            .predicate(
                "size(steps.fetch.output) > 2 && steps['b'].output.all(x, x > inputs.min) && now() > 1",
                super::super::limits::MAX_PREDICATE_DEPTH,
            )
            .expect("compiles");
        assert_eq!(
            paths(&reads),
            ["inputs.min", "steps.b.output", "steps.fetch.output"]
        );
        assert!(reads.functions.contains(&"now".to_owned()));
        assert!(reads.functions.contains(&"size".to_owned()));
        assert!(r.predicate("inputs.x ==", usize::MAX).is_err());
        let deep = vec!["1"; 100].join(" + ");
        assert_eq!(r.predicate(&deep, 16).map(|r| r.depth), Ok(100));
        // Too many chained operators for the limit: counted, not compiled.
        assert_eq!(Reader::new().predicate(&deep, 8).map(|r| r.depth), Ok(99));
        // Macros nested in a body count; one in another's range does not.
        let loops = |src: &str| Reader::new().predicate(src, 32).map(|r| r.loops);
        assert_eq!(loops("inputs.x == 1"), Ok(0));
        assert_eq!(loops("[1].all(a, [2].exists(b, a < b))"), Ok(2));
        assert_eq!(loops("[1].map(a, a).all(b, b > 0)"), Ok(1));
        for (src, chained) in [
            ("a.b == 'x + y' || a['c'] in [1, 2]", 8),
            (r#"'''a ' + b''' + "\" -" + r'-'"#, 2),
            ("index in inputs.list", 2),
        ] {
            assert_eq!(chained_operators(src), chained, "{src}");
        }
    }
}
