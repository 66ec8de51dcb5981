//! What a failed memory test says and writes: the report naming each line that kept memory,
//! with exact bytes, and the files under `target/vramscope/<test>/`.

use super::select::{merge, within};
use super::{sanitize, Failure, MemTest, Metric, Verdict};
use crate::error::{fmt_bytes, fmt_bytes_exact as exact};
use crate::report::{self, plural, FoldedKind};
use crate::snapshot::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

/// The test's blocks at the baseline and at the end, and (where the test ran alone) the blocks
/// outside its scope, each merged over allocators.
pub(super) struct Evidence {
    path: Vec<String>,
    before: Snapshot,
    after: Snapshot,
    outside_before: Snapshot,
    outside_after: Snapshot,
}

/// Exact bytes, with the rounded figure beside them where it reads easier: `262,144 B (256.00 KiB)`.
fn exact_and_round(n: u64) -> String {
    if n < 1024 {
        exact(n)
    } else {
        format!("{} ({})", exact(n), fmt_bytes(n))
    }
}

/// What one allocation site (and scope) holds in one snapshot.
#[derive(Default, Clone)]
struct Tally {
    blocks: u64,
    bytes: u64,
    requested: u64,
    /// Each block's size.
    sizes: Vec<u64>,
    tensors: BTreeSet<String>,
}

/// Live blocks grouped by the line that allocated them (the site table every report groups
/// by) and their scope below `path`.
fn tally(snap: &Snapshot, path: &[String]) -> BTreeMap<(String, String), Tally> {
    let mut out: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut labels = report::Labels::new(snap);
    let test = path.last().map_or("the test", String::as_str);
    for b in snap.live_blocks() {
        let ctx = b.context.as_ref();
        let id = labels.site(ctx);
        let mut site = labels.site_label(id).to_string();
        if site == crate::record::INLINED_TEST_BODY {
            site = format!("{test} (its body; no line tables in this build)");
        } else if site == crate::record::INLINED_ELSEWHERE && !path.is_empty() {
            // Inside the test's scope: the body's code, run by the standard library (a scoped
            // or spawned thread's closure), whose frames a build without line tables folds away.
            site = format!("{test} (a thread or closure of its body; no line tables in this build)");
        }
        let scope = ctx
            .and_then(|c| snap.scope(c.scope))
            .map(|p| if p.starts_with(path) { &p[path.len()..] } else { p })
            .map(|p| p.join("/"))
            .unwrap_or_default();
        let t = out.entry((site, scope)).or_default();
        t.blocks += 1;
        t.bytes += b.size;
        t.requested += b.requested_size;
        t.sizes.push(b.size);
        t.tensors.insert(match (&b.dtype, &b.shape) {
            (Some(d), Some(s)) => format!("{d}{s:?}"),
            (Some(d), None) => d.clone(),
            _ => String::new(),
        });
    }
    out
}

/// A site that holds more at the end than at the baseline.
#[derive(Clone)]
struct Grown {
    site: String,
    scope: String,
    blocks: u64,
    bytes: u64,
    requested: u64,
    /// The sizes of the blocks it holds that it did not hold at the baseline, largest first.
    sizes: Vec<u64>,
    /// The sizes of the blocks it held at the baseline and no longer holds, largest first.
    gone: Vec<u64>,
    tensor: String,
}

/// The blocks of `after` not in `before`, by size (a multiset difference), largest first.
fn new_sizes(mut before: Vec<u64>, mut after: Vec<u64>) -> Vec<u64> {
    before.sort_unstable_by(|a, b| b.cmp(a));
    after.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    let mut old = before.into_iter().peekable();
    for size in after {
        while old.next_if(|&o| o > size).is_some() {}
        if old.next_if_eq(&size).is_none() {
            out.push(size);
        }
    }
    out
}

fn grown(before: &Snapshot, after: &Snapshot, path: &[String]) -> Vec<Grown> {
    let b = tally(before, path);
    let mut out: Vec<Grown> = tally(after, path)
        .into_iter()
        .filter_map(|(key, a)| {
            let z = b.get(&key).cloned().unwrap_or_default();
            (a.requested > z.requested || a.bytes > z.bytes || a.blocks > z.blocks).then(|| Grown {
                site: key.0,
                scope: key.1,
                blocks: a.blocks.saturating_sub(z.blocks),
                bytes: a.bytes.saturating_sub(z.bytes),
                requested: a.requested.saturating_sub(z.requested),
                sizes: new_sizes(z.sizes.clone(), a.sizes.clone()),
                gone: new_sizes(a.sizes.clone(), z.sizes),
                tensor: if a.tensors.len() == 1 {
                    a.tensors.into_iter().next().unwrap_or_default()
                } else {
                    String::new()
                },
            })
        })
        .collect();
    out.sort_by(|x, y| {
        y.requested
            .cmp(&x.requested)
            .then_with(|| y.bytes.cmp(&x.bytes))
            .then_with(|| x.site.cmp(&y.site))
            .then_with(|| x.scope.cmp(&y.scope))
    });
    out
}

/// The lines of grown sites, as the report prints them: exact figures per measured iteration
/// where they divide evenly, else over all of them.
fn render_sites(s: &mut String, sites: &[Grown], iters: u64) {
    let iters = iters.max(1);
    for g in sites {
        // One line per site, within the columns where the function's name allows.
        let _ = writeln!(s, "  {}", report::fit_site(&g.site, report::COLUMNS - 2));
        let even = g.blocks.is_multiple_of(iters) && g.requested.is_multiple_of(iters) && g.bytes.is_multiple_of(iters);
        let (k, when) =
            if even { (iters, "per iteration".to_string()) } else { (1, format!("over {iters} iterations")) };
        let head = format!("{}, {} {when}", plural(g.blocks / k, "block", "blocks"), exact_and_round(g.requested / k));
        // What follows the figures, each part with what joins it to the one before.
        let mut parts = Vec::new();
        if g.blocks == 0 && g.sizes.len() == g.gone.len() && !g.sizes.is_empty() {
            // As many blocks as before, larger: a buffer reallocated larger.
            let (from, to) = (exact(g.gone.iter().sum::<u64>()), exact(g.sizes.iter().sum::<u64>()));
            parts.push((
                "",
                match g.sizes.len() {
                    1 => format!("(its block replaced by a larger one: {from} -> {to})"),
                    n => format!("(its {n} blocks replaced by larger ones: {from} -> {to} in all)"),
                },
            ));
        } else if g.bytes != g.requested {
            parts.push(("", format!("({})", block_sizes(&g.sizes, g.blocks / k))));
        }
        if !g.tensor.is_empty() {
            parts.push((",", g.tensor.clone()));
        }
        if !g.scope.is_empty() {
            parts.push((",", format!("scope {}", g.scope)));
        }
        write_wrapped(s, &head, &parts);
    }
}

/// `head` and then each `(joint, part)` on the line (`joint` and a space before the part) while
/// the line fits [`report::COLUMNS`]; a part that does not starts a line of its own, indented
/// deeper (the joint ending the line before). The figures always open the first line, where
/// scripts read them; a part is never split.
fn write_wrapped(s: &mut String, head: &str, parts: &[(&str, String)]) {
    const INDENT: &str = "      ";
    const MORE: &str = "        ";
    let mut line = format!("{INDENT}{head}");
    for (joint, part) in parts {
        if line.chars().count() + joint.len() + 1 + part.chars().count() <= report::COLUMNS {
            let _ = write!(line, "{joint} {part}");
        } else {
            let _ = writeln!(s, "{line}{joint}");
            line = format!("{MORE}{part}");
        }
    }
    let _ = writeln!(s, "{line}");
}

/// The sizes of a line's blocks, where rounding makes them differ from the bytes asked for:
/// `a block of 512 B`, `blocks of 512 B`, `blocks of 4,096 B and 1,536 B`, `blocks of 4,096 B,
/// 1,536 B and 2 other sizes`.
fn block_sizes(sizes: &[u64], blocks: u64) -> String {
    let mut distinct = sizes.to_vec();
    distinct.dedup();
    let names: Vec<String> = distinct.iter().take(2).map(|&n| exact(n)).collect();
    match (blocks, distinct.len()) {
        (1, 1) => format!("a block of {}", names[0]),
        (_, 0) => "in blocks".to_string(),
        (_, 1) => format!("blocks of {}", names[0]),
        (_, 2) => format!("blocks of {} and {}", names[0], names[1]),
        (_, n) => format!("blocks of {}, {} and {} other sizes", names[0], names[1], n - 2),
    }
}

impl Evidence {
    pub(super) fn new(path: &[String], before: &[Snapshot], after: &[Snapshot]) -> Evidence {
        let pick = |snaps: &[Snapshot], inside: bool| {
            merge(snaps.iter().map(|s| within(s, path, inside)).collect()).unwrap_or_else(|| Snapshot::empty("none"))
        };
        Evidence {
            path: path.to_vec(),
            before: pick(before, true),
            after: pick(after, true),
            outside_before: pick(before, false),
            outside_after: pick(after, false),
        }
    }

    pub(super) fn report(&self, test: &MemTest, v: &Verdict, why: &Failure) -> String {
        let mut s = String::new();
        let iters = test.iters as u64;
        let unit = |n: u64| match test.metric {
            Metric::LiveBlocks => plural(n, "block", "blocks"),
            _ => exact_and_round(n),
        };
        let metric = match test.metric {
            Metric::LiveBytes => "live bytes",
            Metric::LiveBlocks => "live blocks",
            Metric::ReservedBytes => "reserved bytes",
        };
        if why.grew {
            let _ = writeln!(s, "{}: {metric} grew in {}", test.name, plural(iters, "iteration", "iterations"));
            let sites = grown(&self.before, &self.after, &self.path);
            if sites.is_empty() {
                s.push_str("  no allocation site of the test holds more than at the baseline: the growth is in\n");
                s.push_str("  memory outside the test's blocks (the reserved bytes metric counts every allocator)\n");
            } else {
                s.push_str("kept alive per iteration, by the line that allocated it:\n");
                render_sites(&mut s, &sites, iters);
                if sites.iter().any(|g| g.site.contains("no line tables")) {
                    s.push_str("  (for file:line, set `debug = \"line-tables-only\"` in this build's profile)\n");
                }
            }
        } else if why.unattributed {
            let _ = writeln!(s, "{}: {metric} outside the test's scope grew", test.name);
            let _ = writeln!(
                s,
                "  by {} in {} (tolerance {}), while its own blocks did not.\n  \
                 The test ran alone, so this is the body's: a thread or task that did not enter the\n  \
                 test's scope allocated it. Carry the scope: `let s = vramscope::current_scope();`,\n  \
                 then `let _g = s.enter();` in the thread, or `s.wrap(future)` for a task.",
                unit(why.unscoped_growth.max(0) as u64),
                plural(iters, "iteration", "iterations"),
                unit(test.tolerance),
            );
            s.push_str("kept alive per iteration outside the test's scope, by the line that allocated it:\n");
            render_sites(&mut s, &grown(&self.outside_before, &self.outside_after, &[]), iters);
        } else if why.nothing {
            let _ = writeln!(
                s,
                "{}: the body allocated nothing inside the test's scope, so it measured nothing",
                test.name
            );
            s.push_str(
                "  a memory test counts what the body allocates through vramscope allocators (device(n),\n  \
                 or a CachingAllocator it builds) on its own thread, or on threads and tasks that enter\n  \
                 its scope (`current_scope().enter()`, `Scope::wrap`); memory allocated through cudarc or\n  \
                 a framework directly is not seen\n",
            );
        }
        if why.unscoped_allocators > 0 {
            let _ = writeln!(
                s,
                "  note: {} records no scopes (RecordConfig::scopes is off); its blocks cannot be counted",
                plural(why.unscoped_allocators as u64, "allocator", "allocators")
            );
        }
        // The figures behind the verdict: the test's blocks where they grew, the blocks outside
        // its scope where those did; none where the body allocated nothing.
        let (figures, outside) = if why.grew {
            (&v.per_iteration, false)
        } else if why.unattributed {
            (&why.outside_per_iteration, true)
        } else {
            return s;
        };
        let subject = match (test.metric, outside) {
            (Metric::LiveBytes, false) => "live bytes of the test's blocks (bytes asked for, all allocators)",
            (Metric::LiveBytes, true) => "live bytes outside the test's scope (bytes asked for, all allocators)",
            (Metric::LiveBlocks, false) => "live blocks of the test (all allocators)",
            (Metric::LiveBlocks, true) => "live blocks outside the test's scope (all allocators)",
            (Metric::ReservedBytes, _) => "reserved bytes (every allocator: the test's and any other's)",
        };
        let growth = if outside { why.unscoped_growth } else { v.growth }.max(0) as u64;
        let _ = writeln!(
            s,
            "{subject}:\n  grew {} in {} (tolerance {}); at the end of each iteration:",
            unit(growth),
            plural(iters, "iteration", "iterations"),
            unit(test.tolerance)
        );
        let cell = |n: u64| match test.metric {
            Metric::LiveBlocks => format!("{:>14}", plural(n, "block", "blocks")),
            _ if n < 1024 => format!("{:>14}", exact(n)),
            _ => format!("{:>14} {:<13}", exact(n), format!("({})", fmt_bytes(n))),
        };
        let mut previous: Option<u64> = None;
        for (i, x) in figures.iter().enumerate() {
            let tag = if i < test.warmup {
                "warm-up".to_string()
            } else {
                match previous {
                    Some(p) if *x >= p => format!("+{}", unit(x - p)),
                    Some(p) => format!("-{}", unit(p - x)),
                    None => String::new(),
                }
            };
            let _ = writeln!(s, "  {:>3}  {:<28} {tag}", i + 1, cell(*x));
            previous = Some(*x);
        }
        s
    }

    /// Writes `report.txt`, `growth.folded` (only what grew: the sites above are the whole
    /// picture), `live.folded`, their SVGs `growth.svg` and `live.svg` with the `flamegraph`
    /// feature, and `snapshot.json` (the test's blocks at the end).
    pub(super) fn write(&self, test: &MemTest, v: &Verdict) -> Vec<PathBuf> {
        let root = test.evidence_dir.clone().unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("target"))
                .join("vramscope")
        });
        let dir = root.join(sanitize(&test.name));
        if std::fs::create_dir_all(&dir).is_err() {
            return Vec::new();
        }
        let (before, after) = if i128::from(v.growth) > i128::from(test.tolerance) || v.unattributed_growth.is_none() {
            (&self.before, &self.after)
        } else {
            (&self.outside_before, &self.outside_after)
        };
        let live = report::folded(after, FoldedKind::Live);
        let growth = growth_folded(&report::folded(before, FoldedKind::Live), &live);
        let mut files: Vec<(&str, Vec<u8>)> =
            vec![("report.txt", v.report.as_bytes().to_vec()), ("snapshot.json", after.to_json().into_bytes())];
        // The SVGs with the `flamegraph` feature; the folded stacks they are drawn from always
        // (any flamegraph tool draws them: `inferno-flamegraph growth.folded > growth.svg`).
        #[cfg(feature = "flamegraph")]
        files.extend(flamegraphs(test, v, &growth, &live));
        files.push(("growth.folded", growth.into_bytes()));
        files.push(("live.folded", live.into_bytes()));
        files
            .into_iter()
            .filter_map(|(name, bytes)| {
                let p = dir.join(name);
                std::fs::write(&p, bytes).ok().map(|_| p)
            })
            .collect()
    }
}

/// `growth.svg`, titled with the metric per iteration, and `live.svg`, of the folded stacks.
#[cfg(feature = "flamegraph")]
fn flamegraphs(test: &MemTest, v: &Verdict, growth: &str, live: &str) -> Vec<(&'static str, Vec<u8>)> {
    let figures: Vec<String> = v.per_iteration.iter().map(|x| x.to_string()).collect();
    let metric = match test.metric {
        Metric::LiveBytes => "live bytes",
        Metric::LiveBlocks => "live blocks",
        Metric::ReservedBytes => "reserved bytes",
    };
    let subtitle = format!("{metric} of the test at the end of each iteration: {}", figures.join(", "));
    let title = format!("{}: memory kept over {} measured iterations", test.name, test.iters);
    let mut files = Vec::new();
    if let Ok(svg) = report::flamegraph_with_subtitle(growth, &title, Some(&subtitle)) {
        files.push(("growth.svg", svg.into_bytes()));
    }
    if let Ok(svg) = report::flamegraph(live, &format!("{}: live memory after the last iteration", test.name)) {
        files.push(("live.svg", svg.into_bytes()));
    }
    files
}

/// The folded lines whose bytes grew from `before` to `after`, with only the growth.
fn growth_folded(before: &str, after: &str) -> String {
    let parse = |text: &str| -> BTreeMap<String, u64> {
        text.lines()
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(stack, n)| Some((stack.to_string(), n.parse::<u64>().ok()?)))
            .collect()
    };
    let b = parse(before);
    parse(after)
        .into_iter()
        .filter_map(|(stack, n)| {
            let grew = n.saturating_sub(b.get(&stack).copied().unwrap_or(0));
            (grew > 0).then(|| format!("{stack} {grew}\n"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_bytes_read_well() {
        assert_eq!(exact_and_round(262_144), "262,144 B (256.00 KiB)");
        assert_eq!(plural(1, "block", "blocks"), "1 block");
        assert_eq!(plural(2, "block", "blocks"), "2 blocks");
    }

    #[test]
    fn sites_read_per_iteration_when_even() {
        let g = |blocks, bytes, requested, sizes: &[u64]| Grown {
            site: "tests/a.rs:3 (a::f)".into(),
            scope: String::new(),
            blocks,
            bytes,
            requested,
            sizes: sizes.to_vec(),
            gone: Vec::new(),
            tensor: "float32[64, 64]".into(),
        };
        let mut s = String::new();
        render_sites(&mut s, &[g(3, 3 * 16384, 3 * 16384, &[16384; 3])], 3);
        assert_eq!(s, "  tests/a.rs:3 (a::f)\n      1 block, 16,384 B (16.00 KiB) per iteration, float32[64, 64]\n");
        let mut s = String::new();
        render_sites(&mut s, &[g(2, 2048, 2000, &[1024, 1024])], 3);
        assert!(s.contains("2 blocks, 2,000 B (1.95 KiB) over 3 iterations (blocks of 1,024 B)"), "{s}");
        // Two sizes per iteration: the blocks read as what they are, not as one block's size.
        let mut s = String::new();
        render_sites(&mut s, &[g(6, 3 * 5632, 3 * 5200, &[4096, 4096, 4096, 1536, 1536, 1536])], 3);
        assert!(s.contains("2 blocks, 5,200 B (5.08 KiB) per iteration (blocks of 4,096 B and 1,536 B)"), "{s}");
        let mut s = String::new();
        render_sites(&mut s, &[g(3, 3 * 1024, 3 * 1000, &[1024; 3])], 3);
        assert!(s.contains("1 block, 1,000 B per iteration (a block of 1,024 B)"), "{s}");
        // A buffer reallocated larger each iteration: no block more, the one it has larger.
        let mut s = String::new();
        let mut grew = g(0, 3 * 2048, 3 * 2048, &[10240]);
        grew.gone = vec![4096];
        render_sites(&mut s, &[grew.clone()], 3);
        assert!(
            s.contains(
                "0 blocks, 2,048 B (2.00 KiB) per iteration\n        (its block replaced by a larger one: 4,096 B -> \
                 10,240 B), float32[64, 64]\n"
            ),
            "{s}"
        );
        // Wider than the columns: the parts after the figures go on lines of their own, whole.
        grew.requested = 3 * 65536;
        grew.gone = vec![65536];
        grew.sizes = vec![262144];
        grew.scope = "serve/decode/step".into();
        let mut s = String::new();
        render_sites(&mut s, &[grew], 3);
        assert_eq!(
            s,
            "  tests/a.rs:3 (a::f)\n      0 blocks, 65,536 B (64.00 KiB) per iteration\n        \
             (its block replaced by a larger one: 65,536 B -> 262,144 B), float32[64, 64],\n        \
             scope serve/decode/step\n"
        );
        assert!(s.lines().all(|l| l.chars().count() <= report::COLUMNS), "{s}");
    }

    /// In a build without line tables, a thread's closure inlined into the standard library
    /// is named after the test whose scope it ran in, not only as "library frames".
    #[test]
    fn inlined_code_in_the_scope_is_named_after_the_test() {
        let json = include_str!("../../fixtures/hostile/consistent.json")
            .replace("\"function\": \"train_step\"", &format!("\"function\": {:?}", crate::record::INLINED_ELSEWHERE))
            .replace("\"file\": \"train.py\",", "")
            .replace("\"line\": 3", "\"line\": null");
        let snap = Snapshot::from_bytes(json.as_bytes(), "test").unwrap();
        let sites: Vec<String> = tally(&snap, &["t::scoped_thread".to_string()]).into_keys().map(|k| k.0).collect();
        assert_eq!(sites, ["t::scoped_thread (a thread or closure of its body; no line tables in this build)"]);
        let sites: Vec<String> = tally(&snap, &[]).into_keys().map(|k| k.0).collect();
        assert_eq!(sites, [crate::record::INLINED_ELSEWHERE], "outside a test it stays what it is");
    }

    #[test]
    fn new_blocks_are_a_multiset_difference() {
        assert_eq!(new_sizes(vec![512, 4096], vec![4096, 512, 512, 1536, 4096]), [4096, 1536, 512]);
        assert_eq!(new_sizes(vec![512, 512], vec![512]), Vec::<u64>::new());
        assert_eq!(new_sizes(vec![], vec![7, 9]), [9, 7]);
    }

    #[test]
    fn growth_keeps_only_what_grew() {
        let before = "a;b 100\nc 50\n";
        let after = "a;b 300\nc 50\nd 7\n";
        assert_eq!(growth_folded(before, after), "a;b 200\nd 7\n");
    }
}
