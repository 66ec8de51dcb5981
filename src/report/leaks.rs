use super::labels::Labels;
use super::peak::Course;
use super::{bytes, frames};
use crate::intern::{Map, Set};
use crate::record::{Action, Frame};
use crate::snapshot::{BlockState, ContextInfo, HistoryEntry, Snapshot};
use serde::Serialize;

/// An allocation site whose live memory keeps growing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct LeakCandidate {
    /// `file:line (function)` of the allocating code: the innermost frame of the program
    /// itself (library frames such as `torch/nn/modules/linear.py` are skipped).
    pub site: String,
    /// The site's frame.
    pub frame: Frame,
    /// The program's frames that called the site, innermost first (at most three), from the
    /// site's largest surviving allocation.
    pub callers: Vec<String>,
    /// Scope path of that allocation, `a/b`, or empty.
    pub scope: String,
    /// Blocks allocated there and still live at the end of the history.
    pub blocks: u64,
    /// Their bytes, as requested.
    pub bytes: u64,
    /// The bytes of the blocks that hold them: an allocator rounds each request up to a
    /// multiple of 512 bytes, at least 512 (PyTorch's and vramscope's), and may hand out a
    /// larger block; what `memory_allocated()` counts. A scalar kept each step holds 512 bytes
    /// a step where it asked for 4.
    pub block_bytes: u64,
    /// Bytes asked for that the site's floor of live memory rose by per step, from where its
    /// growth began (see [`leaks`]) to the end of the history, leaving out one-time jumps (a
    /// rise of over four times the median rise). PyTorch's history records the bytes asked
    /// for, as vramscope's does since snapshot format 6; an older vramscope file's records its
    /// blocks' sizes, scaled here by the site's live blocks' bytes asked for over their sizes.
    /// Where no steps were marked this is an estimate (windows hold about `steps_per_window`).
    pub bytes_per_step: u64,
    /// Blocks it gained per step, likewise (a growing cache may gain bytes with no new block).
    pub blocks_per_step: f64,
    /// The bytes of blocks it gained per step, likewise, each request rounded up as the
    /// allocator rounds it (see `block_bytes`; a block handed out larger than that is not
    /// seen in a history).
    pub block_bytes_per_step: u64,
    /// Windows (`unit`) in which the floor rose, of `steps`.
    pub growing_steps: u32,
    /// Windows the history is cut into.
    pub steps: u32,
    /// The first and last step (the numbers passed to `vramscope::step`) or window (from 1)
    /// whose memory was kept: a window's allocations show in the floor of the next one.
    /// Per-step figures count the steps that occurred, not the range of their numbers.
    pub grew_from: u64,
    /// See `grew_from`.
    pub grew_until: u64,
    /// Steps where the program marked them, else windows (a tenth of the history's events).
    pub unit: LeakUnit,
    /// Program steps per window where no steps were marked, estimated from the history: how
    /// often a loop body's lines run (see [`leaks`]). With step markers, the steps that
    /// occurred over the windows: 1 up to 100 steps, more where windows group them.
    pub steps_per_window: f64,
}

/// What the leak finder cut the history into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LeakUnit {
    /// One window per step the program marked (`vramscope::step`).
    Step,
    /// A tenth of the history's events, where no steps were marked.
    Window,
}

impl std::fmt::Display for LeakUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            LeakUnit::Step => "step",
            LeakUnit::Window => "window",
        })
    }
}

/// Windows the history is cut into where it has no step markers.
const WINDOWS: usize = 10;
/// Windows at most where steps are marked.
const MAX_STEP_WINDOWS: u64 = 100;

/// Sites whose live memory keeps growing, largest growth first.
///
/// The history is replayed and cut into windows: one per step where the program marked steps
/// (`vramscope::step`; the steps that occurred, in order, whatever their numbers: `step(i * 3)`,
/// a run resumed at step 10000 or sparse numbers give what 0, 1, 2, ... gives), else ten
/// windows of equal numbers of events (not of equal time: the
/// first steps of a PyTorch program are slow). For each allocation site (the innermost frame
/// of the program itself) the *floor* of its live bytes in each window is taken: the least it
/// held at any moment of the window. Temporaries, however large, are freed within a step and
/// do not raise the floor; memory kept across steps does. A site leaks when its floor rises
/// in at least three windows and in at least half of the windows from its first rise to the
/// end, and never falls: memory that is kept and never given back. A cache filled once or
/// state created at one step rises once; gradients accumulated and freed, a KV cache freed
/// per request, or a sliding window fall again. Where no steps were marked, the number of
/// steps per window is estimated from the sites that allocate in every window (a loop body's
/// lines): the most common number of *runs* of a site's allocations, a run being allocations
/// of that site with no other site's allocation between them, so that a line allocating
/// several tensors a step (`torch.ones(n).tril()`, a loop over the parameters) counts one step
/// per execution; where no site has as many runs as there are windows (a loop whose only
/// allocating line runs on without a break), the repeats of such a line's sequence of sizes
/// (a model of library modules called on one line allocates the same sizes in the same order
/// each step), or, where they do not repeat, its number of allocations.
/// The rate is taken over the steps since the growth began: the first rise, or the end of the
/// last pause in it (three windows or more without a rise, and over three times the usual
/// pause), so that a line whose output lives until the next step's replaces it, and which is
/// kept from the middle of a run on, is not spread over steps that kept nothing.
///
/// The figures are estimates where no steps were marked, while the lines named do not depend
/// on them. On the two corpora of real PyTorch programs in `fixtures/torch/corpus` (16 leaking
/// lines; the second corpus written and recorded after the first's rules were set, and the
/// two rules above then written with both in view), blocks per step are within 6.5% of the
/// ground truth on 12 of the 14 lines that leak a block or more a step, 12% off on one more;
/// the last (1.02 blocks a step against 4) is its loop's only allocating line, which runs four
/// identical forward passes an epoch: the finder's step is a pass, the truth's an epoch.
/// Bytes are those asked for (PyTorch's trace gives them: 4 for a scalar in a 512-byte block,
/// where the ground truth counts blocks); where tensors fill their blocks, bytes per step are
/// within 6.5% of the truth's on those lines. The blocks' bytes, each request rounded up to 512
/// as the allocator rounds it, are given beside them where they are over 10% more (what
/// `memory_allocated()` counts): on the three corpus lines that keep scalars or small
/// tensors, within 12% of the truth's bytes (450, 498 and 2,039 B a step against 512, 512 and
/// 2,114), where the bytes asked for are 4, 62 and 16.
///
/// The bytes and blocks "live at the end" are the snapshot's own live blocks at the site where
/// the snapshot holds segments (a history that kept only its last entries saw only some of
/// them), else those the history leaves live. A snapshot whose history holds no allocation
/// gives no candidate, and neither does memory allocated without a stack: [`leak_limits`]
/// says when either is so.
pub fn leaks(snapshot: &Snapshot) -> Vec<LeakCandidate> {
    find(snapshot).candidates
}

/// What the finder's pass over a history gives.
pub(super) struct Found {
    /// The candidates, as [`leaks`] gives them.
    pub(super) candidates: Vec<LeakCandidate>,
    /// The growth per step of the memory allocated without a stack where it passes the
    /// candidates' rule (it has no line to be named by).
    pub(super) unplaced: Option<u64>,
    /// The course of the bytes allocated, each request as its [`rounded`] block: an
    /// allocation adds its block (less the block it replaces at an address allocated twice),
    /// a free of a block the history allocated takes it away.
    pub(super) allocated: Course,
    /// The course of the bytes reserved: segments allocated or mapped, freed or unmapped.
    pub(super) reserved: Course,
}

/// A segment event's change of the bytes reserved.
fn reserved_change(e: &HistoryEntry) -> i128 {
    match e.action {
        Action::SegmentAlloc | Action::SegmentMap => i128::from(e.size),
        Action::SegmentFree | Action::SegmentUnmap => -i128::from(e.size),
        _ => 0,
    }
}

/// The finder: the candidates, and beside them what the same pass over the history sees of
/// the bytes allocated and reserved.
pub(super) fn find(snapshot: &Snapshot) -> Found {
    let hist = &snapshot.history;
    if !hist.iter().any(|e| e.action == Action::Alloc) {
        // No block is allocated, so none is freed either: the reserved bytes alone change.
        let mut reserved = Course::default();
        hist.iter().for_each(|e| reserved.change(reserved_change(e)));
        return Found { candidates: Vec::new(), unplaced: None, allocated: Course::default(), reserved };
    }
    let mut labels = Labels::new(snapshot);
    // PyTorch's history and vramscope's since format 6 record the bytes asked for; earlier
    // vramscope files recorded each block's size.
    let history_asks = snapshot.is_from_pytorch() || snapshot.version >= crate::snapshot::HISTORY_REQUESTED_SINCE;
    // Most histories mark no steps (PyTorch's never do): their windows are the history's
    // tenths. The pass assumes so and gives up at the third step it meets among allocations;
    // the steps are then found and the pass made again by step. (Finding the steps first would
    // read every history twice, and a long history does not stay in the cache.)
    let tenths = Windows::tenths(hist.len());
    let (windows, pass) = match replay(hist, &tenths, &mut labels) {
        Ok(pass) => (tenths, pass),
        Err(GaveUp) => {
            let by_step = Windows::of_steps(hist);
            let pass = replay(hist, &by_step, &mut labels).unwrap_or_else(|GaveUp| unreachable!("by step it goes on"));
            (by_step, pass)
        }
    };
    let Pass { mut sites, live, allocated, reserved, steps_met } = pass;
    let Windows { by_step, count: windows, steps, .. } = windows;
    let steps = if by_step { steps } else { steps_met };
    let marked = steps.len() as u64;
    for &(site, size, i) in live.values() {
        let s = sites[site as usize].as_mut().expect("a live block's site exists");
        s.example = s.example.max(Some((size, std::cmp::Reverse(i))));
    }
    let steps_per_window = if by_step {
        marked as f64 / windows as f64
    } else {
        // The loop body's sites allocate in every window, once per step. A line that allocates
        // several tensors (`torch.ones(n).tril()`, a loop over parameters) does so in one run,
        // no other line allocating in between: its runs count steps where its allocations
        // count them several times. A loop whose only allocating line is that one line runs
        // on without a break, so runs count only where there are at least as many as windows;
        // else the repeats of that line's sizes (a model of library modules called on one
        // line, `preds.append(model(x))`, allocates the same sizes in the same order each
        // step), else its allocations.
        let loop_sites = || sites.iter().flatten().filter(|s| s.windows_allocating.iter().all(|&a| a));
        let most_common = |values: &mut dyn Iterator<Item = u64>| -> Option<u64> {
            let mut counts: Map<u64, u32> = Map::default();
            for v in values {
                *counts.entry(v).or_default() += 1;
            }
            // Between equally common ones the smaller (an inner loop's lines that take turns
            // count once per turn).
            counts.into_iter().max_by_key(|&(n, c)| (c, std::cmp::Reverse(n))).map(|(n, _)| n)
        };
        let per_run = most_common(&mut loop_sites().map(|s| s.runs).filter(|&r| r >= windows as u64))
            .or_else(|| {
                most_common(&mut loop_sites().map(|s| repeats(&s.sizes, windows).unwrap_or(s.sizes.len() as u64)))
            })
            .unwrap_or(windows as u64);
        (per_run as f64 / windows as f64).max(1.0 / windows as f64)
    };
    // What is live at the end, per site: the snapshot's blocks where it has segments.
    let end: Option<Map<u32, (u64, u64, u64)>> = (!snapshot.segments.is_empty()).then(|| {
        let mut end: Map<u32, (u64, u64, u64)> = Map::default();
        let live_blocks = snapshot.segments.iter().flat_map(|g| &g.blocks);
        for b in live_blocks.filter(|b| b.state == BlockState::ActiveAllocated) {
            let e = end.entry(labels.site(b.context.as_ref())).or_default();
            e.0 += b.requested_size;
            e.1 += 1;
            e.2 += b.size;
        }
        end
    });
    let mut out = Vec::new();
    let mut unplaced = None;
    for (site, s) in sites.iter().enumerate().filter_map(|(site, s)| Some((site as u32, s.as_ref()?))) {
        let mut prev = (0u64, 0u64, 0u64);
        let (mut rises, mut first, mut last, mut fell) = (0u32, None, 0u32, false);
        // Each rise: its window, bytes, blocks and block bytes.
        let mut steps_up: Vec<(u32, u64, u64, u64)> = Vec::new();
        for (k, &f) in s.floors.iter().enumerate() {
            if f.0 > prev.0 {
                steps_up.push((k as u32, f.0 - prev.0, f.1.saturating_sub(prev.1), f.2.saturating_sub(prev.2)));
                rises += 1;
                first.get_or_insert(k as u32);
                last = k as u32;
            } else if f.0 < prev.0 && first.is_some() {
                fell = true;
            }
            prev = f;
        }
        let Some(first) = first else { continue };
        let span = windows as u32 - first;
        if fell || rises < 3 || rises * 2 < span {
            continue;
        }

        // The first step (its place among the steps that occurred) of window `w`: the inverse
        // of `window_of`, exact where windows group several steps.
        let start = |w: u32| -> u64 { (u128::from(w) * u128::from(marked)).div_ceil(windows as u128) as u64 };
        // The window whose allocations raised the floor of window `w` is the one before it:
        // its first step, and its last.
        let kept_from = |w: u32| -> u64 {
            let k = w.saturating_sub(1);
            if by_step {
                steps[(start(k) as usize).min(steps.len() - 1)]
            } else {
                u64::from(k) + 1
            }
        };
        let kept_until = |w: u32| -> u64 {
            if by_step {
                steps[(start(w).saturating_sub(1) as usize).min(steps.len() - 1)]
            } else {
                u64::from(w.saturating_sub(1)) + 1
            }
        };
        // Per step: the rises summed over the steps since the growth began, leaving out
        // one-time jumps (a rise over four times the median rise: a library's workspace
        // allocated by the same line in the first step). The growth begins at the first rise,
        // or after the last pause in it: at least three windows without a rise, and over three
        // times the median pause between rises. A line whose result lives until the next step
        // replaces it (`y = m(x)`) raises its floor once, in the first steps; a leak that starts
        // later (a list filled from the middle of a run) would otherwise be spread over steps
        // in which nothing was kept. A slow leak that rises every few windows pauses as long
        // each time, and keeps its first rise.
        let median = |mut v: Vec<u64>| -> u64 {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let pauses: Vec<u64> = steps_up.windows(2).map(|p| u64::from(p[1].0 - p[0].0 - 1)).collect();
        let mut began = first;
        if !pauses.is_empty() {
            let usual = median(pauses.clone());
            for (p, r) in pauses.iter().zip(&steps_up[1..]) {
                if *p >= 3 && *p > usual.saturating_mul(3) {
                    began = r.0;
                }
            }
        }
        let growth: Vec<&(u32, u64, u64, u64)> = steps_up.iter().filter(|r| r.0 >= began).collect();
        let typical = median(growth.iter().map(|r| r.1).collect());
        let kept: Vec<&&(u32, u64, u64, u64)> = growth.iter().filter(|r| r.1 <= typical.saturating_mul(4)).collect();
        // The steps whose allocations the rises counted: from the first of the window before
        // `began` to the last before the last window (whose own allocations show in no floor).
        let steps_grown = if by_step {
            (start(windows as u32 - 1).saturating_sub(start(began.saturating_sub(1))) as f64).max(1.0)
        } else {
            (f64::from(windows as u32 - began) * steps_per_window).max(1.0)
        };
        let mut bytes_per_step = kept.iter().map(|r| r.1 as f64).sum::<f64>() / steps_grown;
        let blocks_per_step = kept.iter().map(|r| r.2 as f64).sum::<f64>() / steps_grown;
        let block_bytes_per_step = kept.iter().map(|r| r.3 as f64).sum::<f64>() / steps_grown;
        let (end_bytes, end_blocks, end_held) =
            end.as_ref().map_or((s.bytes, s.blocks, s.held), |end| end.get(&site).copied().unwrap_or_default());
        if !history_asks && end_held > 0 {
            // A history of block sizes (vramscope's before format 6): the bytes asked for per
            // step are the blocks' in the proportion the site's live blocks hold.
            bytes_per_step *= end_bytes as f64 / end_held as f64;
        }
        let Some(frame) = labels.site_frame(site) else {
            unplaced = Some(bytes_per_step.round() as u64);
            continue;
        };
        let Some((_, std::cmp::Reverse(example))) = s.example else { continue };
        let ctx = hist[example].context;
        let callers = ctx
            .and_then(|c| c.stack)
            .map(|st| {
                frames::program_frames(snapshot.stack_frames(st))
                    .skip(1)
                    .take(3)
                    .map(|f| super::printable(&f.to_string()).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let scope = {
            let id = labels.scope(ctx.as_ref());
            labels.scope_label(id).to_string()
        };
        out.push(LeakCandidate {
            site: super::printable(&frame.to_string()).into_owned(),
            frame: frame.clone(),
            callers,
            scope,
            blocks: end_blocks,
            bytes: end_bytes,
            block_bytes: end_held,
            bytes_per_step: bytes_per_step.round() as u64,
            blocks_per_step: (blocks_per_step * 100.0).round() / 100.0,
            block_bytes_per_step: block_bytes_per_step.round() as u64,
            growing_steps: rises,
            steps: windows as u32,
            grew_from: kept_from(first),
            grew_until: kept_until(last),
            unit: if by_step { LeakUnit::Step } else { LeakUnit::Window },
            steps_per_window,
        });
    }
    out.sort_by(|a, b| b.bytes_per_step.cmp(&a.bytes_per_step).then_with(|| a.site.cmp(&b.site)));
    Found { candidates: out, unplaced, allocated, reserved }
}

/// How the finder cuts a history into windows: by the steps a program marked, or, where it
/// marked fewer than three, into tenths of its events.
struct Windows {
    by_step: bool,
    /// How many windows.
    count: usize,
    /// Events in the history.
    events: usize,
    /// The step numbers that occurred among allocations, in the order they first occurred,
    /// and each one's place among them (by step only).
    steps: Vec<u64>,
    order: Map<u64, u64>,
}

impl Windows {
    fn tenths(events: usize) -> Windows {
        Windows { by_step: false, count: WINDOWS, events, steps: Vec::new(), order: Map::default() }
    }

    /// Windows by step: windows follow the steps a program marked, not the range or the
    /// direction of their numbers, so that strided (`step(i * 3)`), resumed (0, then 10000
    /// on), sparse and descending (`step(10)` down to `step(1)`) numbering give what 0, 1, 2,
    /// ... gives. One window per step, up to MAX_STEP_WINDOWS (then steps are grouped): the
    /// floors cost sites x windows.
    fn of_steps(hist: &[HistoryEntry]) -> Windows {
        let mut steps: Vec<u64> = Vec::new();
        let mut order: Map<u64, u64> = Map::default();
        for e in hist.iter().filter(|e| e.action == Action::Alloc) {
            let step = step_of(e);
            order.entry(step).or_insert_with(|| {
                steps.push(step);
                steps.len() as u64 - 1
            });
        }
        let by_step = steps.len() >= 3;
        let count = if by_step { (steps.len() as u64).min(MAX_STEP_WINDOWS) as usize } else { WINDOWS };
        Windows { by_step, count, events: hist.len(), steps, order }
    }

    /// The window of event `i` of step `step` (`None`: its context has none): by step, its
    /// step's place among the steps that occurred. An event of a step no allocation had (a
    /// free recorded without its context) stays in the window of the events before it (0 here:
    /// the caller keeps the later of the two).
    fn of(&self, i: usize, step: Option<u64>) -> usize {
        if self.by_step {
            let marked = self.steps.len() as u64;
            let Some(&rank) = step.and_then(|step| self.order.get(&step)) else { return 0 };
            let k = u128::from(rank.min(marked - 1)) * self.count as u128 / u128::from(marked);
            (k as usize).min(self.count - 1)
        } else {
            (i * self.count / self.events).min(self.count - 1)
        }
    }
}

/// An allocation's step: its context's, 0 where it has none.
fn step_of(e: &HistoryEntry) -> u64 {
    e.context.map_or(0, |c: ContextInfo| c.step)
}

/// Per site: live bytes, blocks and block bytes now, and per window the floor of each.
struct Site {
    bytes: u64,
    blocks: u64,
    held: u64,
    floors: Vec<(u64, u64, u64)>,
    /// Runs of allocations at this site with no other site's allocation between them:
    /// one per execution of a loop's line, however many tensors it allocates.
    runs: u64,
    /// The sizes of its allocations in order (their number: its allocations), where no
    /// steps were marked.
    sizes: Vec<u64>,
    windows_allocating: Vec<bool>,
    /// The largest surviving allocation (size, then earliest), for callers and scope.
    example: Option<(u64, std::cmp::Reverse<usize>)>,
}

/// What the finder's pass over the history leaves.
struct Pass {
    /// By site id (the labels' ids are dense): two or three lookups per event, no hashing.
    sites: Vec<Option<Site>>,
    /// The blocks live at the end: site, size and event, by address.
    live: Map<u64, (u32, u64, usize)>,
    allocated: Course,
    reserved: Course,
    /// The steps met among allocations, in order (windows in tenths: fewer than three).
    steps_met: Vec<u64>,
}

/// Windows in tenths met a third step: the history is to be cut by step.
struct GaveUp;

/// The finder's pass over `hist`, cut into `windows`: each site's live bytes and their floor
/// in each window, and the courses of the bytes allocated and reserved.
fn replay(hist: &[HistoryEntry], windows: &Windows, labels: &mut Labels<'_>) -> Result<Pass, GaveUp> {
    let count = windows.count;
    let mut sites: Vec<Option<Site>> = Vec::new();
    let mut live: Map<u64, (u32, u64, usize)> = Map::default();
    let (mut allocated, mut reserved) = (Course::default(), Course::default());
    let mut steps_met: Vec<u64> = Vec::new();
    let mut window = 0;
    let mut last_site = None;
    // The window of the last event's step: events come in runs of one step.
    let mut last_step: Option<(u64, usize)> = None;
    for (i, e) in hist.iter().enumerate() {
        let step = e.context.map(|c| c.step);
        let of = match (step, last_step) {
            (Some(step), Some((last, w))) if windows.by_step && step == last => w,
            _ => {
                let w = windows.of(i, step);
                if let Some(step) = step {
                    last_step = Some((step, w));
                }
                w
            }
        };
        let w = of.max(window);
        if w != window {
            // A new window starts from what each site holds now.
            for s in sites.iter_mut().flatten() {
                for k in window + 1..=w {
                    s.floors[k] = (s.bytes, s.blocks, s.held);
                }
            }
            window = w;
        }
        let touched = match e.action {
            Action::Alloc => {
                if !windows.by_step && !steps_met.contains(&step_of(e)) {
                    if steps_met.len() == 2 {
                        return Err(GaveUp);
                    }
                    steps_met.push(step_of(e));
                }
                let site = labels.site(e.context.as_ref());
                if sites.len() <= site as usize {
                    sites.resize_with(site as usize + 1, || None);
                }
                let s = sites[site as usize].get_or_insert_with(|| Site {
                    bytes: 0,
                    blocks: 0,
                    held: 0,
                    floors: vec![(0, 0, 0); count],
                    runs: 0,
                    sizes: Vec::new(),
                    windows_allocating: vec![false; count],
                    example: None,
                });
                s.bytes = s.bytes.saturating_add(e.size);
                s.blocks += 1;
                s.held = s.held.saturating_add(rounded(e.size));
                if !windows.by_step {
                    s.sizes.push(e.size);
                }
                if last_site != Some(site) {
                    s.runs += 1;
                    last_site = Some(site);
                }
                s.windows_allocating[w] = true;
                let replaced = live.insert(e.addr, (site, e.size, i));
                let replaced_block = replaced.map_or(0, |(_, old_size, _)| rounded(old_size));
                allocated.change(i128::from(rounded(e.size)) - i128::from(replaced_block));
                if let Some((old_site, old_size, _)) = replaced {
                    // An address allocated twice without a free in between (a trimmed
                    // history): the older block is gone.
                    if let Some(o) = sites.get_mut(old_site as usize).and_then(Option::as_mut) {
                        o.bytes = o.bytes.saturating_sub(old_size);
                        o.blocks = o.blocks.saturating_sub(1);
                        o.held = o.held.saturating_sub(rounded(old_size));
                        let f = &mut o.floors[w];
                        *f = (f.0.min(o.bytes), f.1.min(o.blocks), f.2.min(o.held));
                    }
                }
                Some(site)
            }
            Action::FreeRequested | Action::FreeCompleted => match live.remove(&e.addr) {
                Some((site, size, _)) => {
                    allocated.change(-i128::from(rounded(size)));
                    let s = sites[site as usize].as_mut().expect("a live block's site exists");
                    s.bytes = s.bytes.saturating_sub(size);
                    s.blocks = s.blocks.saturating_sub(1);
                    s.held = s.held.saturating_sub(rounded(size));
                    Some(site)
                }
                None => None,
            },
            _ => {
                reserved.change(reserved_change(e));
                None
            }
        };
        if let Some(site) = touched {
            let s = sites[site as usize].as_mut().expect("just touched");
            let f = &mut s.floors[w];
            f.0 = f.0.min(s.bytes);
            f.1 = f.1.min(s.blocks);
            f.2 = f.2.min(s.held);
        }
    }
    for s in sites.iter_mut().flatten() {
        for k in window + 1..count {
            s.floors[k] = (s.bytes, s.blocks, s.held);
        }
    }
    Ok(Pass { sites, live, allocated, reserved, steps_met })
}

/// The block a request of `size` bytes takes at least: rounded up to the allocator's smallest
/// block, 512 bytes, as PyTorch's caching allocator (`kMinBlockSize`) and vramscope's round it.
pub(super) fn rounded(size: u64) -> u64 {
    use crate::alloc::heap::MIN_BLOCK;
    size.max(1).div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
}

/// How many times `sizes` repeats one pattern: its length over the shortest period of its
/// second half (so that a first step's one-time allocations do not break it), where that half
/// holds the pattern at least `windows` times; `None` where no such period exists (shapes
/// that change from step to step).
fn repeats(sizes: &[u64], windows: usize) -> Option<u64> {
    let half = &sizes[sizes.len() / 2..];
    if half.len() < windows {
        return None;
    }
    // The prefix function: the longest proper prefix of half[..=i] that is also its suffix.
    let mut border = vec![0usize; half.len()];
    for i in 1..half.len() {
        let mut k = border[i - 1];
        while k > 0 && half[i] != half[k] {
            k = border[k - 1];
        }
        if half[i] == half[k] {
            k += 1;
        }
        border[i] = k;
    }
    let period = half.len() - border[half.len() - 1];
    (period * windows <= half.len()).then(|| (sizes.len() as f64 / period as f64).round() as u64)
}

/// What a snapshot's history leaves the leak finder unable to see or to name, for a reader of
/// its candidates: without it an empty list reads as "no leak" where the finder could not
/// tell. See [`leak_limits`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LeakLimits {
    /// Allocations in the history. None: nothing can be judged (a PyTorch snapshot recorded
    /// with `_record_memory_history(enabled="state")`, or a vramscope one with no history).
    pub allocations: u64,
    /// Of them, those with no stack (PyTorch's `context=None`): their memory has no line.
    pub without_stack: u64,
    /// Where the memory allocated without a stack, taken together, passes the leak rule: its
    /// growth per step. `None` does not clear it: temporaries and memory freed at the end
    /// count with it.
    pub without_stack_growth: Option<u64>,
    /// History entries recorded but dropped from vramscope's ring before the snapshot.
    pub dropped: u64,
    /// Frees in the history of blocks whose allocation it does not hold: it starts in the
    /// middle of the program's work (recording started after they were allocated, or a ring
    /// that kept only its last entries, such as PyTorch's `max_entries`), and growth before
    /// its first entry is not seen.
    pub frees_unseen: u64,
    /// Blocks live in the snapshot whose allocation the history does not hold (weights loaded
    /// before recording started, or blocks whose allocation a ring dropped).
    pub live_before_history: u64,
    /// Their bytes (requested).
    pub live_before_history_bytes: u64,
    /// Whether the snapshot came from PyTorch's format: the notes then name PyTorch's settings.
    pub from_pytorch: bool,
}

/// What [`leaks`] cannot see or name in `snapshot`: no history, allocations without stacks,
/// a history that starts in the middle of the program's work. Where both are wanted,
/// [`leaks_with_limits`] replays the history once instead of twice.
pub fn leak_limits(snapshot: &Snapshot) -> LeakLimits {
    let mut limits = limits(snapshot);
    if limits.without_stack > 0 {
        limits.without_stack_growth = find(snapshot).unplaced;
    }
    limits
}

/// [`leaks`] and [`leak_limits`] of `snapshot`, from one replay of its history. The limits'
/// pass over a long history runs on another core beside the finder's.
pub fn leaks_with_limits(snapshot: &Snapshot) -> (Vec<LeakCandidate>, LeakLimits) {
    let (mut limits, found) = super::beside(snapshot.history.len(), || limits(snapshot), || find(snapshot));
    if limits.without_stack > 0 {
        limits.without_stack_growth = found.unplaced;
    }
    (found.candidates, limits)
}

/// [`leak_limits`]'s pass over the snapshot: all but the growth of the memory without a stack
/// ([`find`]'s, asked for only where some allocation has none).
fn limits(snapshot: &Snapshot) -> LeakLimits {
    let mut limits = LeakLimits {
        dropped: snapshot.history_dropped,
        from_pytorch: snapshot.is_from_pytorch(),
        ..LeakLimits::default()
    };
    let mut allocated: Set<u64> = Set::default();
    for e in &snapshot.history {
        match e.action {
            Action::Alloc => {
                allocated.insert(e.addr);
                limits.allocations += 1;
                limits.without_stack += u64::from(e.context.and_then(|c| c.stack).is_none());
            }
            Action::FreeRequested | Action::FreeCompleted if !allocated.contains(&e.addr) => {
                // Counted once per block: its free_requested and free_completed both come here.
                allocated.insert(e.addr);
                limits.frees_unseen += 1;
            }
            _ => {}
        }
    }
    for b in snapshot.segments.iter().flat_map(|g| &g.blocks) {
        if b.state == BlockState::ActiveAllocated && !allocated.contains(&b.address) {
            limits.live_before_history += 1;
            limits.live_before_history_bytes += b.requested_size;
        }
    }
    limits
}

impl LeakLimits {
    /// Notes for a reader of the candidates, each a paragraph filled to 90 columns; empty
    /// where the history covers everything the finder needs.
    pub fn render(&self) -> String {
        let mut notes: Vec<String> = Vec::new();
        if self.allocations == 0 {
            let how = if self.from_pytorch {
                "PyTorch keeps them with torch.cuda.memory._record_memory_history() (its default, \
                 enabled=\"all\"; not enabled=\"state\")"
            } else {
                "vramscope keeps them where the allocator records a history (RecordConfig's default; \
                 not RecordConfig::off())"
            };
            notes.push(format!(
                "The history holds no allocation, so nothing here says whether memory leaks: the leak \
                 finder reads the allocations and frees over time. {how}. `vramscope live` shows what \
                 is live; `vramscope diff` compares two snapshots."
            ));
        } else if self.without_stack == self.allocations || self.without_stack_growth.is_some() {
            // Some allocations without a stack are normal (PyTorch's Python stacks: none on
            // autograd's thread); a note where none has one, or where that memory grows.
            let why = if self.without_stack == self.allocations {
                "recorded without stacks: PyTorch's context=None"
            } else {
                "made where no stack was recorded, such as autograd's thread with Python stacks"
            };
            let mut note = format!(
                "{} of {} allocations in the history have no stack ({why}), so their memory cannot be \
                 put on a line",
                self.without_stack, self.allocations
            );
            match self.without_stack_growth {
                Some(g) => note.push_str(&format!(
                    ". Taken together it grows, +{} per step, kept and never given back.",
                    bytes(g)
                )),
                None => note.push_str(", and whether some of it leaks cannot be told from the rest."),
            }
            if self.without_stack == self.allocations {
                note.push_str(" Record with stacks (context=\"all\", the default) to name the lines.");
            }
            notes.push(note);
        }
        if self.allocations > 0 && (self.frees_unseen > 0 || self.dropped > 0) {
            let why = if self.dropped > 0 {
                format!("its first {} entries were dropped when its ring was full", self.dropped)
            } else {
                format!(
                    "it frees {} block{} it never saw allocated: recording started after they were \
                     allocated{}",
                    self.frees_unseen,
                    if self.frees_unseen == 1 { "" } else { "s" },
                    if self.from_pytorch {
                        ", or PyTorch's ring (max_entries) dropped their allocation"
                    } else {
                        ", or the snapshot keeps part of the history only, such as one scope's"
                    }
                )
            };
            let mut note = format!(
                "The history starts in the middle of the program's work ({why}). Growth before its \
                 first entry is not seen, and figures per step count only what it holds"
            );
            if self.live_before_history > 0 {
                note.push_str(&format!(
                    "; {} block{} ({}) live at the end {} allocated before it",
                    self.live_before_history,
                    if self.live_before_history == 1 { "" } else { "s" },
                    bytes(self.live_before_history_bytes),
                    if self.live_before_history == 1 { "was" } else { "were" },
                ));
            }
            note.push('.');
            notes.push(note);
        }
        notes.iter().map(|n| format!("\n{}", fill(n, 90))).collect()
    }
}

/// What usually keeps a leak candidate's memory alive, in the words of the language its sites
/// are written in: Python's containers for a PyTorch program, Rust's for a Rust one.
fn advice(sites: &[&str]) -> &'static str {
    let python = sites.iter().any(|s| s.contains(".py:"));
    let rust = sites.iter().any(|s| s.contains(".rs:") || s.contains("::"));
    match (python, rust) {
        (true, false) => "a list, dict or cache that is never emptied, a hook or closure, a tensor with its graph.\n",
        (false, true) => {
            "a Vec, map or cache that is never cleared, a clone of an Arc held elsewhere, a buffer\n\
             moved into a struct that outlives the step, or mem::forget.\n"
        }
        _ => "a collection or cache that is never emptied, or a reference held by something long-lived.\n",
    }
}

/// `text` in lines of at most `width` columns, broken between words (a word longer than
/// `width` stands alone on its line), each ended by a newline.
fn fill(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in text.split_whitespace() {
        let w = word.chars().count();
        if line > 0 && line + 1 + w > width {
            out.push('\n');
            line = 0;
        }
        if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += w;
    }
    out.push('\n');
    out
}

impl LeakCandidate {
    /// The report as text, with what the history left the finder unable to see or name
    /// ([`LeakLimits::render`]): where the history holds no allocation, only that; where no
    /// line leaks but memory without a stack grows, that instead of "no leak candidates".
    pub fn render_with_limits(candidates: &[LeakCandidate], limits: &LeakLimits) -> String {
        let notes = limits.render();
        if limits.allocations == 0 {
            return notes.trim_start().to_string();
        }
        if candidates.is_empty() && limits.without_stack == limits.allocations {
            return format!("no line to name: no allocation in the history has a stack\n{notes}");
        }
        if candidates.is_empty() && limits.without_stack_growth.is_some() {
            return format!("no line to name: the memory that keeps growing has no stack\n{notes}");
        }
        Self::render(candidates) + &notes
    }

    /// The report as text.
    pub fn render(candidates: &[LeakCandidate]) -> String {
        if candidates.is_empty() {
            return "no leak candidates: no allocation site keeps memory that grows step after step\n".to_string();
        }
        let n = candidates.len();
        let mut s = format!(
            "{n} leak candidate{}: the lines that allocated memory which is kept and keeps growing\n",
            if n == 1 { "" } else { "s" }
        );
        if let Some(c) = candidates.iter().find(|c| c.unit == LeakUnit::Window) {
            s.push_str(&format!(
                "(no step markers: the history is cut into {} windows of equal numbers of events,\n\
                 about {:.1} steps each, estimated from how often the loop's lines allocate)\n",
                c.steps, c.steps_per_window
            ));
        }
        for c in candidates {
            s.push_str(&format!(
                "\n{}\n  +{} and {} block{} per step; {} in {} block{} live at the end\n",
                super::fit_site(&c.site, super::COLUMNS),
                bytes(c.bytes_per_step),
                c.blocks_per_step,
                if c.blocks_per_step == 1.0 { "" } else { "s" },
                bytes(c.bytes),
                c.blocks,
                if c.blocks == 1 { "" } else { "s" },
            ));
            // Where the blocks hold much more than was asked for (scalars, small tensors),
            // what memory grows by, as `memory_allocated()` counts it.
            let much_more = |held: u64, asked: u64| held as f64 > asked as f64 * 1.1;
            if much_more(c.block_bytes_per_step, c.bytes_per_step) || much_more(c.block_bytes, c.bytes) {
                s.push_str(&format!(
                    "  held in blocks of 512 B or more: +{} per step, {} at the end\n",
                    bytes(c.block_bytes_per_step),
                    bytes(c.block_bytes)
                ));
            }
            s.push_str(&format!(
                "  kept memory from {} of {} {}s ({}s {} to {})\n",
                c.growing_steps, c.steps, c.unit, c.unit, c.grew_from, c.grew_until,
            ));
            for caller in &c.callers {
                const CALLED_FROM: &str = "  called from ";
                let caller = super::fit_site(caller, super::COLUMNS - CALLED_FROM.len());
                s.push_str(&format!("{CALLED_FROM}{caller}\n"));
            }
            if !c.scope.is_empty() {
                s.push_str(&format!("  in scope {}\n", c.scope));
            }
        }
        s.push_str("\nEach line named allocated memory that stays alive; what keeps it is where its results go:\n");
        s.push_str(advice(&candidates.iter().map(|c| c.site.as_str()).collect::<Vec<_>>()));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_speaks_the_language_of_the_sites() {
        let py = advice(&["train.py:12 (step)"]);
        let rs = advice(&["src/main.rs:40 (app::step)"]);
        assert!(py.contains("list, dict") && !py.contains("Vec"), "{py}");
        assert!(rs.contains("Vec") && !rs.contains("dict"), "{rs}");
        let mixed = advice(&["train.py:12 (step)", "src/main.rs:40 (app::step)"]);
        assert!(!mixed.contains("dict") && !mixed.contains("Vec"), "{mixed}");
    }

    #[test]
    fn repeats_count_a_pattern_after_a_first_step_and_nothing_without_one() {
        let step = [512, 4096, 512, 1 << 20];
        let mut sizes = vec![7, 7, 9]; // a first step's one-time allocations
        for _ in 0..40 {
            sizes.extend(step);
        }
        assert_eq!(repeats(&sizes, 10), Some(41)); // 163 allocations over a period of 4
        let changing: Vec<u64> = (0..200).map(|i| 512 * (i * i % 97 + 1)).collect();
        assert_eq!(repeats(&changing, 10), None);
        // Too few repeats of a long pattern to tell it from chance.
        let long: Vec<u64> = (0..40).map(|i| 512 * (i % 15 + 1)).collect();
        assert_eq!(repeats(&long, 10), None);
        // Twice in the second half is not ten times, however short the pattern is beside it.
        let twice: Vec<u64> = (0..60).map(|i| 512 * (i % 15 + 1)).collect();
        assert_eq!(repeats(&twice, 10), None);
        assert_eq!(repeats(&twice, 2), Some(4));
        assert_eq!(repeats(&[], 10), None);
        // A pattern whose prefix repeats inside it (512, 512, 4096): the period is found by
        // falling back along the borders, not by the first mismatch.
        let inner: Vec<u64> = (0..60).map(|i| if i % 3 == 2 { 4096 } else { 512 }).collect();
        assert_eq!(repeats(&inner, 10), Some(20));
        let nested: Vec<u64> = (0..80).map(|i| [1, 1, 2, 1, 1, 3, 1, 1][i % 8]).collect();
        assert_eq!(repeats(&nested, 5), Some(10));
        // Broken in its last step: no period, however well it repeated before.
        let mut broken: Vec<u64> = (0..19).map(|i| if i % 2 == 0 { 2 } else { 1 }).collect();
        broken.push(3);
        assert_eq!(repeats(&broken, 3), None);
    }

    /// What the history could not show carries the ring's dropped entries and whose file it
    /// is (PyTorch's `max_entries` is named where the file is PyTorch's).
    #[test]
    fn limits_carry_dropped_entries_and_whose_file_it_is() {
        let alloc = crate::CachingAllocator::new(crate::backend::HostBackend::new(1 << 26));
        let x = alloc.alloc::<u8>(&alloc.default_stream(), 4096).unwrap();
        let mut snap = alloc.snapshot();
        snap.history_dropped = 7;
        let (_, l) = leaks_with_limits(&snap);
        assert_eq!((l.dropped, l.from_pytorch), (7, false));
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch/leaky_train.snapshot.pickle");
        let torch = Snapshot::load(path).unwrap();
        let (_, l) = leaks_with_limits(&torch);
        assert!(l.from_pytorch);
        drop(x);
    }

    #[test]
    fn fill_breaks_between_words_within_the_width() {
        assert_eq!(fill("a bb ccc dddd", 6), "a bb\nccc\ndddd\n");
        assert_eq!(fill("a verylongword b", 4), "a\nverylongword\nb\n");
        assert_eq!(fill("", 10), "\n");
    }

    #[test]
    fn a_snapshot_without_history_is_not_called_leak_free() {
        let snap = Snapshot::empty("sim");
        let limits = leak_limits(&snap);
        assert_eq!(limits.allocations, 0);
        let text = LeakCandidate::render_with_limits(&leaks(&snap), &limits);
        assert!(text.starts_with("The history holds no allocation"), "{text}");
        assert!(!text.contains("no leak candidates"), "{text}");
    }
}
