//! Where a key of a configuration file is written: the line and column of a dotted key path
//! (`routes[2].upstream`, `metrics.native.schema`) in the TOML text, so that a problem found by
//! validation (a value that parses but is wrong) points at its line as a syntax error does.
//!
//! The toml crate's deserializer keeps no spans once a value is read into the raw
//! configuration; `toml_edit`'s document (the parser the toml crate itself uses) keeps the span
//! of every key and value, so the text is parsed a second time, only when there is a problem.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Table};

/// One step of a key path: a table key or an index into an array (of tables).
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The steps of a dotted key path: `routes[2].upstream` is `routes`, `2`, `upstream`. `None`
/// for a path that is not one (`(file)`, `--config`).
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(at) => (&part[..at], &part[at..]),
            None => (part, ""),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        steps.push(Step::Key(name));
        while let Some(inner) = rest.strip_prefix('[') {
            let close = inner.find(']')?;
            steps.push(Step::Index(inner[..close].parse().ok()?));
            rest = &inner[close + 1..];
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(steps)
}

/// Where a walk down a key path is: an item, or a table of an array of tables (which the
/// document hands out as a table, not as an item).
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Table(&'a Table),
}

impl<'a> Node<'a> {
    fn step(self, step: &Step<'_>) -> Option<Node<'a>> {
        match (self, step) {
            (Node::Table(table), Step::Key(key)) => table.get(key).map(Node::Item),
            (Node::Table(_), Step::Index(_)) => None,
            (Node::Item(Item::ArrayOfTables(tables)), Step::Index(i)) => {
                tables.get(*i).map(Node::Table)
            }
            (Node::Item(item), Step::Key(key)) => item.get(*key).map(Node::Item),
            (Node::Item(item), Step::Index(i)) => item.get(*i).map(Node::Item),
        }
    }

    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Item(item) => item.span(),
            Node::Table(table) => table.span(),
        }
    }
}

/// The byte span of the deepest step of `path` that the text writes: the value itself when it
/// is written, else the nearest table or array of tables that holds where it would be (a missing
/// key is reported at its table's header). `None` when the text does not parse or writes no
/// step of the path.
fn span_of(text: &str, path: &str) -> Option<Range<usize>> {
    let document = ImDocument::parse(text).ok()?;
    let mut node = Node::Item(document.as_item());
    let mut best = None;
    for step in steps(path)? {
        let Some(next) = node.step(&step) else { break };
        best = next.span().or(best);
        node = next;
    }
    best
}

/// Whether `text` writes the key `path` itself (not only a table around it), so a value that
/// equals the default can be told from one left out.
pub fn writes(text: &str, path: &str) -> bool {
    let Ok(document) = ImDocument::parse(text) else {
        return false;
    };
    let Some(steps) = steps(path) else {
        return false;
    };
    let mut node = Node::Item(document.as_item());
    for step in &steps {
        match node.step(step) {
            Some(next) => node = next,
            None => return false,
        }
    }
    true
}

/// The 1-based line and column (in characters) where `path` is written in `text`, or where
/// its nearest enclosing table is, if the key itself is not written.
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let span = span_of(text, path)?;
    let before = text.get(..span.start)?;
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Some((line, column))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
[server]
listen = \"127.0.0.1:8080\"
admin = \"nope\"

[metrics.native]
schema = 12

[[routes]]
name = \"chat\"
path = \"/v1/chat/completions\"

[[routes]]
name = \"completions\"
upstream = \"ftp://x\"
";

    #[test]
    fn a_value_is_found_at_its_own_line_and_column() {
        assert_eq!(locate(FILE, "server.admin"), Some((3, 9)));
        assert_eq!(locate(FILE, "metrics.native.schema"), Some((6, 10)));
    }

    #[test]
    fn a_key_of_an_array_of_tables_is_found_in_its_element() {
        assert_eq!(locate(FILE, "routes[1].upstream"), Some((14, 12)));
        assert_eq!(locate(FILE, "routes[0].path"), Some((10, 8)));
    }

    #[test]
    fn a_missing_key_points_at_its_table() {
        assert_eq!(locate(FILE, "routes[0].upstream"), Some((8, 1)));
        assert_eq!(locate(FILE, "server.workers"), Some((1, 1)));
    }

    #[test]
    fn what_is_not_a_key_path_or_not_written_has_no_place() {
        assert_eq!(locate(FILE, "(file)"), None);
        assert_eq!(locate(FILE, "--config"), None);
        assert_eq!(locate(FILE, "timeline.max_frames"), None);
        assert_eq!(locate("not [valid", "server.admin"), None);
    }

    #[test]
    fn a_key_is_written_only_when_the_text_has_it() {
        assert!(writes(FILE, "routes"));
        assert!(writes(FILE, "server.listen"));
        assert!(writes(FILE, "routes[1].upstream"));
        assert!(!writes(FILE, "server.upstream"));
        assert!(!writes(FILE, "routes[0].upstream"));
        assert!(!writes("", "routes"));
        assert!(writes("routes = []\n", "routes"));
        assert!(!writes(
            "[server]\nupstream = \"http://x\"\n",
            "server.upstream[0]"
        ));
    }

    #[test]
    fn key_paths_split_into_steps() {
        assert_eq!(
            steps("routes[2].upstream"),
            Some(vec![
                Step::Key("routes"),
                Step::Index(2),
                Step::Key("upstream")
            ])
        );
        assert_eq!(steps("a.b"), Some(vec![Step::Key("a"), Step::Key("b")]));
        assert_eq!(steps("a[x]"), None);
        assert_eq!(steps("a]"), None);
    }
}
