//! Live memory over the history, stacked by allocation site: what PyTorch's viewer calls the
//! Active Memory Timeline, aggregated before it is drawn so that its size is bounded whatever
//! the history's length.

use super::labels::Labels;
use crate::intern::Map;
use crate::record::Action;
use crate::snapshot::Snapshot;
use serde::Serialize;
use std::fmt::Write as _;

/// Sites drawn as bands of their own; the rest share one band.
pub const TIMELINE_SITES: usize = 12;

/// Points on the time axis at most: a long history is sampled, a short one drawn whole.
pub const TIMELINE_POINTS: usize = 400;

/// Live bytes over the history, one band per site: what [`timeline`] computes and
/// [`Timeline::to_svg`] draws.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Timeline {
    /// The history's events, counted from its first (the time axis).
    pub events: usize,
    /// The event after which each point is taken (the last point is the end of the history).
    pub points: Vec<usize>,
    /// The bands, largest peak first; the band of the other sites, where there is one, last.
    pub bands: Vec<Band>,
    /// Live bytes at the history's start that it does not show the allocation of (blocks
    /// allocated before the history begins, freed within it): the floor the bands stand on is
    /// left out, so the bands count only what the history shows.
    pub unseen_frees: u64,
}

/// One band of a [`Timeline`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Band {
    /// The site (`file:line (function)`), or `other sites (N)`.
    pub label: String,
    /// Bytes live at each point (bytes asked for), as [`Timeline::points`].
    pub bytes: Vec<u64>,
    /// The most the band held at any point.
    pub peak: u64,
    /// Whether the leak finder names this site ([`super::leaks`]).
    pub leak_candidate: bool,
}

/// Live memory over the snapshot's history, stacked by the site that allocated it: the
/// [`TIMELINE_SITES`] sites with the highest peaks in bands of their own, the rest in one
/// band, sampled at most [`TIMELINE_POINTS`] times. Bytes are those asked for, as the leak
/// finder counts them; a free of a block the history did not see allocated is counted in
/// [`Timeline::unseen_frees`] and changes no band.
pub fn timeline(snapshot: &Snapshot) -> Timeline {
    let hist = &snapshot.history;
    let mut labels = Labels::new(snapshot);
    let events = hist.len();
    let n_points = events.clamp(1, TIMELINE_POINTS);
    // The event after which point k is taken: the ends of `n_points` equal slices.
    let points: Vec<usize> = (1..=n_points).map(|k| (k * events).div_ceil(n_points).saturating_sub(1)).collect();
    let mut live: Map<u64, (u32, u64)> = Map::default();
    let mut by_site: Map<u32, u64> = Map::default();
    // Per site, its bytes at each point (filled as points pass).
    let mut series: Map<u32, Vec<u64>> = Map::default();
    let mut unseen = 0u64;
    // The leak finder's candidates are marked on the bands: on a long history it runs on
    // another core while this one aggregates.
    let find = || -> std::collections::HashSet<String> { super::leaks(snapshot).into_iter().map(|c| c.site).collect() };
    let (candidates, ()) = super::beside(events, find, || {
        let mut next = 0;
        for (i, e) in hist.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    let site = labels.site(e.context.as_ref());
                    if let Some((old, size)) = live.insert(e.addr, (site, e.size)) {
                        // An address allocated twice without a free between (a trimmed history).
                        let b = by_site.entry(old).or_default();
                        *b = b.saturating_sub(size);
                    }
                    let b = by_site.entry(site).or_default();
                    *b = b.saturating_add(e.size);
                }
                Action::FreeRequested | Action::FreeCompleted => match live.remove(&e.addr) {
                    Some((site, size)) => {
                        let b = by_site.entry(site).or_default();
                        *b = b.saturating_sub(size);
                    }
                    None if e.action == Action::FreeRequested => unseen = unseen.saturating_add(e.size),
                    None => {}
                },
                _ => {}
            }
            while next < points.len() && points[next] == i {
                for (&site, &bytes) in &by_site {
                    let s = series.entry(site).or_insert_with(|| vec![0; points.len()]);
                    s[next] = bytes;
                }
                next += 1;
            }
        }
    });
    let mut sites: Vec<(u32, Vec<u64>, u64)> = series
        .into_iter()
        .map(|(site, bytes)| {
            let peak = bytes.iter().copied().max().unwrap_or(0);
            (site, bytes, peak)
        })
        .filter(|(_, _, peak)| *peak > 0)
        .collect();
    sites.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| labels.site_label(a.0).cmp(labels.site_label(b.0))));
    let rest = sites.split_off(sites.len().min(TIMELINE_SITES));
    let mut bands: Vec<Band> = sites
        .into_iter()
        .map(|(site, bytes, peak)| {
            let label = labels.site_label(site).to_string();
            Band { leak_candidate: candidates.contains(&label), label, bytes, peak }
        })
        .collect();
    if !rest.is_empty() {
        let mut bytes = vec![0u64; points.len()];
        for (_, b, _) in &rest {
            for (t, x) in bytes.iter_mut().zip(b) {
                *t = t.saturating_add(*x);
            }
        }
        let peak = bytes.iter().copied().max().unwrap_or(0);
        bands.push(Band { label: format!("other sites ({})", rest.len()), bytes, peak, leak_candidate: false });
    }
    let points = if events == 0 { Vec::new() } else { points };
    if events == 0 {
        bands.clear();
    }
    Timeline { events, points, bands, unseen_frees: unseen }
}

/// XML text: `&`, `<`, `>` and quotes escaped, control characters dropped.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// Colours of the bands (the last, grey, for the other sites).
const COLOURS: [&str; TIMELINE_SITES] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#86bcb6", "#8cd17d",
    "#d4a6c8", "#a0cbe8",
];

impl Timeline {
    /// The timeline as a standalone SVG picture: stacked areas, a band's site and peak in its
    /// tooltip (`<title>`) and in the legend, leak candidates outlined in red and marked in the
    /// legend. Its size is bounded by [`TIMELINE_SITES`] and [`TIMELINE_POINTS`], whatever the
    /// history's length; it loads no script and no font from anywhere.
    pub fn to_svg(&self, title: &str) -> String {
        let (width, plot_h, left, top) = (1000.0f64, 360.0f64, 80.0f64, 40.0f64);
        let plot_w = width - left - 20.0;
        let legend_top = top + plot_h + 40.0;
        let height = legend_top + 18.0 * self.bands.len() as f64 + 20.0;
        let total: Vec<u64> = (0..self.points.len())
            .map(|k| self.bands.iter().map(|b| b.bytes[k]).fold(0, u64::saturating_add))
            .collect();
        let max = total.iter().copied().max().unwrap_or(0).max(1) as f64;
        let x = |k: usize| {
            let event = self.points[k] as f64 + 1.0;
            left + plot_w * event / self.events.max(1) as f64
        };
        let y = |bytes: u64| top + plot_h - plot_h * bytes as f64 / max;
        let mut s = String::new();
        let _ = write!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{left}\" y=\"22\" font-size=\"15\">{}</text>\n",
            xml(title)
        );
        // Axes: bytes at the top of the scale, events along the bottom.
        let _ = write!(
            s,
            "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
             <line x1=\"{left}\" y1=\"{b}\" x2=\"{}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} events</text>\n",
            top + plot_h,
            left + plot_w,
            left - 4.0,
            top + 10.0,
            xml(&super::bytes(max as u64)),
            left - 4.0,
            top + plot_h,
            left + plot_w,
            top + plot_h + 16.0,
            self.events,
            b = top + plot_h,
        );
        let mut below = vec![0u64; self.points.len()];
        for (i, band) in self.bands.iter().enumerate() {
            let other = band.label.starts_with("other sites (");
            let colour = if other { "#bab0ac" } else { COLOURS[i % COLOURS.len()] };
            let mut path = String::new();
            for (k, (floor, bytes)) in below.iter().zip(&band.bytes).enumerate() {
                let _ = write!(path, "{}{:.1},{:.1} ", if k == 0 { "M" } else { "L" }, x(k), y(floor + bytes));
            }
            for (k, floor) in below.iter().enumerate().rev() {
                let _ = write!(path, "L{:.1},{:.1} ", x(k), y(*floor));
            }
            let stroke = if band.leak_candidate { " stroke=\"#d62728\" stroke-width=\"2\"" } else { "" };
            let _ = writeln!(
                s,
                "<path d=\"{}Z\" fill=\"{colour}\"{stroke}><title>{}: peak {}{}</title></path>",
                path,
                xml(&band.label),
                xml(&super::bytes(band.peak)),
                if band.leak_candidate { " (leak candidate)" } else { "" }
            );
            for (b, x) in below.iter_mut().zip(&band.bytes) {
                *b = b.saturating_add(*x);
            }
            let ly = legend_top + 18.0 * i as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{left}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{colour}\"{stroke}/>\
                 <text x=\"{}\" y=\"{}\">{}{}, peak {}</text>",
                ly - 10.0,
                left + 18.0,
                ly,
                if band.leak_candidate { "LEAK CANDIDATE: " } else { "" },
                xml(&band.label),
                xml(&super::bytes(band.peak)),
            );
        }
        s.push_str("</svg>\n");
        s
    }
}
