//! `magpie-kmem diff A B`: what grew from one dump to the next, per call
//! site and per cache, in the layout of the shell's `allocinfo diff` (the
//! "two copies of `/proc/allocinfo`" step of leak hunting, from records).
//!
//! The figures are the bytes and objects **live at the end** of each
//! record (as `live` counts them), B minus A, signed. Call sites are
//! matched by name (`FILE:LINE func:FUNCTION`, the code-tag layout, when
//! the kernel's symbols are found; else the raw address), so two boots of
//! different builds compare; caches by name.

use std::collections::BTreeMap;

use crate::analysis::Replay;
use crate::dump::Dump;
use crate::symbols::Symbolizer;

/// Live bytes and objects per key.
type Table = BTreeMap<String, (i64, i64)>;

/// One dump's live objects at the end, by site and by cache.
pub struct Side {
    /// The file, as given.
    pub label: String,
    /// Per call site: (bytes, objects).
    pub sites: Table,
    /// Per cache: (bytes, objects).
    pub caches: Table,
}

impl Side {
    /// Sums the objects live at the end of `replay`.
    pub fn of(label: &str, dump: &Dump, replay: &Replay, sym: &Symbolizer) -> Side {
        let mut names: BTreeMap<u64, String> = BTreeMap::new();
        let mut sites = Table::new();
        let mut caches = Table::new();
        for e in replay.live.values() {
            let name = names
                .entry(e.call_site)
                .or_insert_with(|| sym.site(e.call_site).tag_info())
                .clone();
            for (table, key) in [
                (&mut sites, name),
                (&mut caches, dump.cache_name(e.cache_id)),
            ] {
                let row = table.entry(key).or_default();
                row.0 += e.bytes_alloc as i64;
                row.1 += 1;
            }
        }
        Side {
            label: label.to_string(),
            sites,
            caches,
        }
    }
}

/// Rows that changed: (bytes, objects, key), most bytes grown first, then
/// most shrunk last; ties by key.
fn changes(a: &Table, b: &Table) -> Vec<(i64, i64, String)> {
    let mut rows: Vec<(i64, i64, String)> = a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|key| {
            let (bytes_a, calls_a) = a.get(key).copied().unwrap_or_default();
            let (bytes_b, calls_b) = b.get(key).copied().unwrap_or_default();
            let row = (bytes_b - bytes_a, calls_b - calls_a, key.clone());
            (row.0 != 0 || row.1 != 0).then_some(row)
        })
        .collect();
    rows.sort_by(|x, y| y.0.cmp(&x.0).then(y.1.cmp(&x.1)).then(x.2.cmp(&y.2)));
    rows
}

fn table(out: &mut String, header: &str, rows: &[(i64, i64, String)], top: Option<usize>) {
    out.push_str(header);
    for (bytes, calls, key) in rows.iter().take(top.unwrap_or(usize::MAX)) {
        out.push_str(&format!("{bytes:>+12} {calls:>+8} {key}\n"));
    }
}

/// The report: sites, then caches (see the module doc).
pub fn diff_text(a: &Side, b: &Side, top: Option<usize>) -> String {
    let sites = changes(&a.sites, &b.sites);
    let caches = changes(&a.caches, &b.caches);
    let mut out = format!(
        "magpie-kmem diff - live at the end of {} -> {}, {} site{} changed\n",
        a.label,
        b.label,
        sites.len(),
        if sites.len() == 1 { "" } else { "s" }
    );
    table(&mut out, "#     <size>  <calls> <tag info>\n", &sites, top);
    out.push('\n');
    table(&mut out, "#     <size>  <calls> <cache>\n", &caches, top);
    out
}
