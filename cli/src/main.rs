//! The `vramscope` command line.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use vramscope::replay::{replay, ReplayOptions, Trace};
use vramscope::report::{self, FoldedKind};
use vramscope::{
    backend::Backend, backend::HostBackend, backend::SimBackend, config::AllocatorConfig, record::RecordConfig,
    record::StackMode, CachingAllocator, Snapshot,
};

#[derive(Parser)]
#[command(name = "vramscope", version, about = "GPU memory you can see and test", max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Frames whose file or function contains PATTERN are the program's own code, whatever
    /// the built-in rule says (e.g. `src/mypkg/` for a package installed under site-packages).
    /// Repeat for more; the longer of a user-code and a library pattern that both match decides.
    /// Default: the VRAMSCOPE_USER_CODE environment variable (comma-separated).
    #[arg(long = "user-code", value_name = "PATTERN", global = true)]
    user_code: Vec<String>,
    /// Frames whose file or function contains PATTERN are a library's, never a site (e.g.
    /// `vendor/`, `third_party/`, `my_helpers::`). Repeat for more. Default: the
    /// VRAMSCOPE_LIBRARY environment variable (comma-separated).
    #[arg(long = "library", value_name = "PATTERN", global = true)]
    library: Vec<String>,
    /// The most a file may expand to when read, gzip included (e.g. `16GiB`). Default: the
    /// VRAMSCOPE_READ_LIMIT environment variable, else 64 times the file's size and at least
    /// 256 MiB.
    #[arg(long = "read-limit", value_name = "SIZE", global = true)]
    read_limit: Option<String>,
}

/// Where a report goes.
#[derive(clap::Args)]
struct Output {
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// The memory summary table (PyTorch's layout).
    Summary {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Print the statistics as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// The device's ledger a snapshot carries: the process's memory as the driver counted it,
    /// split into what held it (`vramscope::ledger`).
    Ledger {
        /// A vramscope JSON snapshot taken with its ledger.
        file: PathBuf,
        /// Print the ledger as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Live tensors grouped by allocation site and scope, largest first.
    Live {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Allocation sites whose live blocks keep growing across steps (or time).
    Leaks {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Sites that are new, grew or shrank between two snapshots.
    Diff {
        /// The earlier snapshot.
        before: PathBuf,
        /// The later snapshot.
        after: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Each segment's map: used, free, rounding waste, largest free block.
    Segments {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Print the segments as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Folded stacks (`frame;frame bytes`) of live memory, or of all allocations.
    Folded {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Count every allocation in the history (churn) instead of live memory.
        #[arg(long)]
        allocated: bool,
        #[command(flatten)]
        out: Output,
    },
    /// A flamegraph SVG of live memory by stack (scopes as frames), of all allocations, or of
    /// the difference from an earlier snapshot.
    Flamegraph {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Count every allocation in the history (churn) instead of live memory.
        #[arg(long)]
        allocated: bool,
        /// Draw the difference from this earlier snapshot.
        #[arg(long)]
        before: Option<PathBuf>,
        #[command(flatten)]
        out: Output,
    },
    /// An SVG of live memory over the history, stacked by the line that allocated it (the
    /// largest sites in bands of their own, leak candidates outlined), as PyTorch's viewer's
    /// Active Memory Timeline; `--json` gives the figures drawn.
    Timeline {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// Print the figures as JSON instead of drawing them.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Snapshots of one job's ranks side by side (one file per rank, read in parallel): what
    /// each holds now and at its peak, the sites whose bytes differ most between ranks, and
    /// the ranks the leak finder flags.
    Ranks {
        /// One snapshot per rank, in rank order (vramscope JSON or PyTorch pickles).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Converts a snapshot between vramscope's JSON and PyTorch's pickle (readable by
    /// `python -m torch.cuda._memory_viz` and PyTorch's memory_viz page).
    Convert {
        /// A vramscope JSON snapshot or a PyTorch snapshot pickle.
        file: PathBuf,
        /// The format to write. Default: the output's extension (`.json`; `.pickle` or `.pkl`),
        /// else JSON. A `--to` that contradicts the extension is refused.
        #[arg(long, value_enum)]
        to: Option<Format>,
        /// Where to write (required for a pickle).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Replay the allocations of a PyTorch snapshot pickle or a JSON trace through vramscope's
    /// allocator: once cold, then warm; print time per operation and peak memory.
    Replay {
        /// A PyTorch snapshot pickle (`device_traces` is replayed) or a `*.trace.json` file, either
        /// of them gzipped or not.
        file: PathBuf,
        /// Where memory comes from.
        #[arg(long, value_enum, default_value_t = BackendKind::Sim)]
        backend: BackendKind,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Warm passes after the cold one (their median time is reported), at most 100,000.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=100_000))]
        warm: u32,
        /// Allocator configuration in `VRAMSCOPE_ALLOC_CONF` form, e.g. `fragmentation_limit:off`
        /// (default: the `VRAMSCOPE_ALLOC_CONF` environment variable).
        #[arg(long)]
        config: Option<String>,
        /// Device capacity, e.g. `80GiB` (default: 80 GiB for sim, 4x the trace's peak for host);
        /// on CUDA, the most the allocator may reserve (default: the whole device).
        #[arg(long)]
        capacity: Option<String>,
        /// What the allocator records during the replay: nothing, scopes and history, or also
        /// stacks (cached unwind tables, or the `backtrace` crate).
        #[arg(long, value_enum, default_value_t = RecordLevel::Off)]
        record: RecordLevel,
    },
    /// The smallest memory a PyTorch snapshot pickle's or a JSON trace's allocations fit in
    /// with vramscope's allocator, with virtual and with `cuMemAlloc` segments: bisection on
    /// the most the allocator may reserve, replaying on the sim deciding as on CUDA (as the
    /// GPU did on every fixture trace measured).
    Fit {
        /// A PyTorch snapshot pickle (`device_traces` is replayed) or a `*.trace.json` file, either
        /// of them gzipped or not.
        file: PathBuf,
        /// The GPU's memory, e.g. `80GiB` (what the allocator reserves addresses for).
        #[arg(long, default_value = "80GiB")]
        device_memory: String,
        /// Allocator configuration in `VRAMSCOPE_ALLOC_CONF` form (default: the
        /// `VRAMSCOPE_ALLOC_CONF` environment variable); its `release_pages` is set for each
        /// segment kind in turn.
        #[arg(long)]
        config: Option<String>,
        /// Warm passes after the cold one at each cap tried.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100))]
        warm: u32,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendKind {
    /// Address space only: measures the allocator alone.
    Sim,
    /// The same, deciding as on CUDA: segment calls count as costly, so the fragmentation limit
    /// rises when holding to it churns (`fragmentation_limit_max:auto`). Shows without a GPU
    /// what a CUDA replay will reserve and how many driver calls its warm passes make.
    SimCuda,
    /// Host memory standing in for a device.
    Host,
    /// CUDA device 0 (needs the `cuda` feature).
    Cuda,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// vramscope's JSON snapshot.
    Json,
    /// PyTorch's snapshot pickle.
    Pickle,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Pickle => "pickle",
        }
    }
}

/// The format a file's extension names, if it names one.
fn format_of_name(path: &std::path::Path) -> Option<Format> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "json" => Some(Format::Json),
        "pickle" | "pkl" => Some(Format::Pickle),
        _ => None,
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum RecordLevel {
    /// No recording: the allocator alone.
    Off,
    /// Scopes, threads, steps and the history; no stacks.
    Scopes,
    /// Also stacks, by the fastest exact unwinder (cached `.eh_frame` tables on x86-64 Linux).
    Fast,
    /// Also stacks, by the `backtrace` crate's unwinder (microseconds a stack).
    Full,
}

impl RecordLevel {
    fn config(self) -> RecordConfig {
        let mut c = RecordConfig::default();
        match self {
            RecordLevel::Off => return RecordConfig::off(),
            RecordLevel::Scopes => c.stacks = StackMode::Off,
            RecordLevel::Fast => c.stacks = StackMode::Fast,
            RecordLevel::Full => c.stacks = StackMode::Full,
        }
        c
    }
}

/// A failure with the exit code it deserves: 2 for input the user must fix, 1 otherwise.
struct Failure(u8, String);

impl From<vramscope::Error> for Failure {
    fn from(e: vramscope::Error) -> Self {
        let code = match e {
            // Input the user must fix; an impossible request in a trace is the trace's.
            vramscope::Error::Format { .. }
            | vramscope::Error::Io { .. }
            | vramscope::Error::Config { .. }
            | vramscope::Error::InvalidRequest(_) => 2,
            _ => 1,
        };
        Failure(code, e.to_string())
    }
}

fn emit(out: &Output, text: &str) -> Result<(), Failure> {
    match &out.output {
        Some(path) => write_output(path, text.as_bytes()),
        None => print(text),
    }
}

/// Writes to standard output. A reader that stopped reading (`| head`) ends the command
/// quietly, as it does for other command-line tools, instead of a panic.
fn print(text: &str) -> Result<(), Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure(1, format!("writing to standard output: {e}"))),
    }
}

/// Writes to standard error, where nothing that fails there (a full or closed stream) is worth
/// a panic: the exit code still says what happened.
fn note(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Writes an output file named with `-o`: a path the user must fix (a missing directory, a
/// directory, a full device) is exit code 2 with one line. A regular file is written whole or
/// not at all: the bytes go to a temporary file beside it, renamed over it once complete, so a
/// full disk leaves the file it would have replaced as it was. Anything else (`/dev/stdout`,
/// a FIFO) is written in place.
fn write_output(path: &std::path::Path, bytes: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    let fail = |e: std::io::Error| Failure(2, format!("cannot write {}: {e}", path.display()));
    let special = std::fs::metadata(path).is_ok_and(|m| !m.is_file());
    let Some(name) = path.file_name().filter(|_| !special) else {
        return std::fs::write(path, bytes).map_err(fail);
    };
    let mut temporary = name.to_os_string();
    temporary.push(format!(".vramscope-{}.partial", std::process::id()));
    let temporary = path.with_file_name(temporary);
    let written = std::fs::File::create(&temporary).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&temporary, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&temporary);
            Err(fail(e))
        }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(value).map(|s| s + "\n").map_err(|e| Failure(1, e.to_string()))
}

/// A report of each device of `snaps` (one snapshot, or before and after): made once for a
/// snapshot of one device; for several, once per device, the text under a `device N:` line and
/// the JSON as an object keyed by device.
fn per_device<T: serde::Serialize>(
    snaps: &[&Snapshot],
    json: bool,
    make: impl Fn(&[&Snapshot]) -> T,
    render: impl Fn(&T) -> String,
) -> Result<String, Failure> {
    let reports = PerDevice::new(snaps, make)?;
    if json {
        reports.json()
    } else {
        Ok(reports.text(render))
    }
}

/// The reports of [`per_device`], before they are written: one without a device for a
/// snapshot of one device, else one per device in order.
struct PerDevice<T>(Vec<(Option<usize>, T)>);

impl<T> PerDevice<T> {
    fn new(snaps: &[&Snapshot], make: impl Fn(&[&Snapshot]) -> T) -> Result<Self, Failure> {
        let mut devices: Vec<usize> = snaps.iter().flat_map(|s| s.devices()).collect();
        devices.sort_unstable();
        devices.dedup();
        if devices.len() <= 1 {
            return Ok(PerDevice(vec![(None, make(snaps))]));
        }
        // Each snapshot split by device once, then one report per device.
        let parts: Vec<Vec<Snapshot>> = snaps.iter().map(|s| s.try_by_devices(&devices)).collect::<Result<_, _>>()?;
        let reports = devices.iter().enumerate();
        Ok(PerDevice(
            reports.map(|(i, &d)| (Some(d), make(&parts.iter().map(|p| &p[i]).collect::<Vec<_>>()))).collect(),
        ))
    }

    /// Each report replaced by a part of it.
    fn map<U>(self, f: impl Fn(T) -> U) -> PerDevice<U> {
        PerDevice(self.0.into_iter().map(|(d, r)| (d, f(r))).collect())
    }

    fn text(&self, render: impl Fn(&T) -> String) -> String {
        let texts = self.0.iter().map(|(d, r)| match d {
            Some(d) => format!("device {d}:\n{}", render(r)),
            None => render(r),
        });
        texts.collect::<Vec<_>>().join("\n")
    }

    fn json(&self) -> Result<String, Failure>
    where
        T: serde::Serialize,
    {
        match self.0.as_slice() {
            [(None, report)] => to_json(report),
            reports => {
                let map: std::collections::BTreeMap<String, &T> =
                    reports.iter().filter_map(|(d, r)| Some((d.as_ref()?.to_string(), r))).collect();
                to_json(&map)
            }
        }
    }
}

/// Folded stacks of every device: for a snapshot of several, each device's stacks under a root
/// frame `device N`.
fn folded_per_device(snap: &Snapshot, kind: FoldedKind) -> Result<String, Failure> {
    let reports = PerDevice::new(&[snap], |s| report::folded(s[0], kind))?;
    let folded = reports.0.into_iter().map(|(d, folded)| match d {
        None => folded,
        Some(d) => folded.lines().map(|l| format!("device {d};{l}\n")).collect(),
    });
    Ok(folded.collect())
}

fn run(cli: Cli) -> Result<(), Failure> {
    if let Some(limit) = &cli.read_limit {
        let bytes = vramscope::config::parse_bytes(limit).map_err(|e| Failure(2, format!("--read-limit: {e}")))?;
        vramscope::snapshot::set_read_limit(Some(bytes));
    }
    if !cli.user_code.is_empty() || !cli.library.is_empty() {
        // The options replace the environment's patterns, each kind that is given.
        let env = report::FramePolicy::from_env().map_err(|e| Failure(2, e.to_string()))?;
        let (env_user, env_library) = (env.user_code_patterns().to_vec(), env.library_patterns().to_vec());
        let user = if cli.user_code.is_empty() { env_user } else { cli.user_code.clone() };
        let library = if cli.library.is_empty() { env_library } else { cli.library.clone() };
        report::FramePolicy::new(user, library).map_err(|e| Failure(2, e.to_string()))?.install();
    }
    match cli.command {
        Command::Summary { file, json, out } => {
            let snap = Snapshot::load(file)?;
            let text = if json {
                per_device(&[&snap], true, |s| s[0].stats.to_pytorch_map(), |_| String::new())?
            } else {
                per_device(&[&snap], false, |s| report::summary(s[0]), String::clone)?
            };
            emit(&out, &text)
        }
        Command::Ledger { file, json, out } => {
            let name = file.display().to_string();
            let snap = Snapshot::load(file)?;
            let Some(ledger) = &snap.ledger else {
                return Err(Failure(
                    2,
                    format!(
                        "{name} carries no ledger (a PyTorch snapshot, or one taken without it: \
                         take it with vramscope::ledger::snapshot_with_ledger)"
                    ),
                ));
            };
            let text = if json {
                serde_json::to_string_pretty(ledger).map_err(|e| Failure(1, e.to_string()))? + "\n"
            } else {
                ledger.to_text()
            };
            emit(&out, &text)
        }
        Command::Live { file, json, out } => {
            let snap = Snapshot::load(file)?;
            emit(
                &out,
                &per_device(&[&snap], json, |s| report::live(s[0]), |g| report::LiveGroup::render_in_columns(g))?,
            )
        }
        Command::Leaks { file, json, out } => {
            let snap = Snapshot::load(file)?;
            if json {
                // The JSON stays the list of candidates; what the history could not show goes to
                // standard error, so that an empty list is not read as "no leak".
                let reports = PerDevice::new(&[&snap], |s| report::leaks_with_limits(s[0]))?;
                let notes: String = reports.0.iter().map(|(_, (_, limits))| limits.render()).collect();
                let text = reports.map(|(candidates, _)| candidates).json()?;
                // The JSON first: notes that cannot be written never keep it from its reader.
                emit(&out, &text)?;
                if !notes.trim().is_empty() {
                    note(notes.trim_start());
                }
                return Ok(());
            }
            let render = |(c, l): &(Vec<report::LeakCandidate>, report::LeakLimits)| {
                report::LeakCandidate::render_with_limits(c, l)
            };
            emit(&out, &per_device(&[&snap], false, |s| report::leaks_with_limits(s[0]), render)?)
        }
        Command::Diff { before, after, json, out } => {
            let (before, after) = (Snapshot::load(before)?, Snapshot::load(after)?);
            let d =
                per_device(&[&before, &after], json, |s| report::diff(s[0], s[1]), |d| report::SiteDelta::render(d))?;
            emit(&out, &d)
        }
        Command::Segments { file, json, out } => {
            let snap = Snapshot::load(file)?;
            let text = if json {
                per_device(&[&snap], true, |s| s[0].segments.clone(), |_| String::new())?
            } else {
                per_device(&[&snap], false, |s| report::segments(s[0]), String::clone)?
            };
            emit(&out, &text)
        }
        Command::Folded { file, allocated, out } => {
            let kind = if allocated { FoldedKind::Allocated } else { FoldedKind::Live };
            emit(&out, &folded_per_device(&Snapshot::load(file)?, kind)?)
        }
        Command::Flamegraph { file, allocated, before, out } => {
            let kind = if allocated { FoldedKind::Allocated } else { FoldedKind::Live };
            let title = format!("{} of {}", if allocated { "allocated bytes" } else { "live bytes" }, file.display());
            let after = folded_per_device(&Snapshot::load(&file)?, kind)?;
            let svg = match before {
                Some(b) => {
                    report::differential_flamegraph(&folded_per_device(&Snapshot::load(b)?, kind)?, &after, &title)?
                }
                None => report::flamegraph(&after, &title)?,
            };
            if out.output.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                return Err(Failure(2, "a flamegraph is an SVG file: name one with -o (e.g. -o live.svg)".into()));
            }
            emit(&out, &svg)
        }
        Command::Timeline { file, json, out } => {
            let snap = Snapshot::load(&file)?;
            if json {
                return emit(&out, &per_device(&[&snap], true, |s| report::timeline(s[0]), |_| String::new())?);
            }
            let devices = snap.devices();
            if devices.len() > 1 {
                return Err(Failure(
                    2,
                    format!(
                        "{} holds {} devices: a timeline draws one (`vramscope timeline --json` gives each)",
                        file.display(),
                        devices.len()
                    ),
                ));
            }
            if out.output.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                return Err(Failure(2, "a timeline is an SVG file: name one with -o (e.g. -o timeline.svg)".into()));
            }
            let title = format!("live bytes over the history of {}", file.display());
            emit(&out, &report::timeline(&snap).to_svg(&title))
        }
        Command::Ranks { files, json, out } => {
            // Reading dominates, and each file is read apart: one reader per core takes the next
            // file until none is left, and reads the rank's figures from its snapshot at once,
            // while its history is in the cache, then reads the next file into its memory. (A
            // thread per file ran eight parses on two cores at once, each slower for the others'
            // caches, and held every half-read file at once.)
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            // The largest files first: a large file taken last would be read on one core while
            // the others wait. (A file that cannot be measured goes last and fails when read.)
            let mut queue: Vec<usize> = (0..files.len()).collect();
            queue.sort_by_cached_key(|&i| std::cmp::Reverse(std::fs::metadata(&files[i]).map_or(0, |m| m.len())));
            let next = std::sync::atomic::AtomicUsize::new(0);
            let mut read: Vec<(usize, Result<report::RankPart, vramscope::Error>)> = std::thread::scope(|scope| {
                let readers: Vec<_> = (0..cores.min(files.len()))
                    .map(|_| {
                        scope.spawn(|| {
                            let mut read = Vec::new();
                            // Each file read into the memory of the one before.
                            let mut before: Option<Snapshot> = None;
                            loop {
                                let taken = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let Some(&i) = queue.get(taken) else { return read };
                                let f = &files[i];
                                match Snapshot::load_reusing(f, before.take()) {
                                    Ok(snap) => {
                                        read.push((i, Ok(report::rank_part(&f.display().to_string(), &snap))));
                                        before = Some(snap);
                                    }
                                    Err(e) => read.push((i, Err(e))),
                                }
                            }
                        })
                    })
                    .collect();
                readers.into_iter().flat_map(|h| h.join().expect("a reading thread does not panic")).collect()
            });
            read.sort_by_key(|(i, _)| *i);
            // The first file that fails, in the order given, is the error.
            let parts = read.into_iter().map(|(_, part)| part).collect::<Result<Vec<_>, _>>()?;
            let r = report::ranks_from(parts);
            emit(&out, &if json { to_json(&r)? } else { r.render() })
        }
        Command::Convert { file, to, output } => {
            let named = output.as_deref().and_then(format_of_name);
            let to = match (to, named) {
                (Some(to), Some(named)) if to != named => {
                    let name = output.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
                    return Err(Failure(
                        2,
                        format!(
                            "--to {} contradicts the output's name {name} ({}): drop --to or rename the output",
                            to.name(),
                            named.name()
                        ),
                    ));
                }
                (Some(to), _) => to,
                (None, Some(named)) => named,
                (None, None) => Format::Json,
            };
            let snap = Snapshot::load(file)?;
            match (to, output) {
                (Format::Json, output) => emit(&Output { output }, &(snap.to_json() + "\n")),
                (Format::Pickle, Some(path)) => write_output(&path, &snap.to_pytorch_pickle()),
                (Format::Pickle, None) => Err(Failure(2, "a pickle is binary data: name a file with -o".into())),
            }
        }
        Command::Replay { file, backend, json, warm, config, capacity, record } => {
            let trace = Trace::from_file(&file)?;
            #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
            let mut config = match config {
                Some(c) => AllocatorConfig::parse(&c)?,
                None => AllocatorConfig::from_env()?,
            };
            let capacity = capacity
                .map(|c| vramscope::config::parse_bytes(&c))
                .transpose()
                .map_err(|e| Failure(2, e.to_string()))?;
            let backend: std::sync::Arc<dyn Backend> = match backend {
                BackendKind::Sim => std::sync::Arc::new(SimBackend::new(capacity.unwrap_or(80 << 30))),
                BackendKind::SimCuda => {
                    std::sync::Arc::new(SimBackend::new(capacity.unwrap_or(80 << 30)).with_costly_segments(true))
                }
                #[cfg(feature = "cuda")]
                BackendKind::Cuda => {
                    let cuda = vramscope::backend::CudaBackend::new(0)?;
                    if let Some(c) = capacity {
                        // The most the allocator may reserve: a smaller GPU, seen from this one.
                        config.limit_to_capacity(c, cuda.total_memory())?;
                    }
                    std::sync::Arc::new(cuda)
                }
                #[cfg(not(feature = "cuda"))]
                BackendKind::Cuda => {
                    return Err(Failure(2, "--backend cuda needs vramscope built with the `cuda` feature".into()))
                }
                BackendKind::Host => {
                    let peak = trace.events.iter().fold(0u64, |n, e| n.saturating_add(e.size)).min(64 << 30);
                    std::sync::Arc::new(HostBackend::new(capacity.unwrap_or(peak.saturating_mul(4).max(1 << 30))))
                }
            };
            let alloc = CachingAllocator::with_config(backend, config)?;
            alloc.record_memory_history(record.config());
            let mut options = ReplayOptions::default();
            options.warm_passes = warm as usize;
            let report = replay(&alloc, &trace, &options)?;
            let mut text = String::new();
            if json {
                text = serde_json::to_string(&report).map_err(|e| Failure(1, e.to_string()))? + "\n";
            } else {
                // (Writing to a String cannot fail.)
                use std::fmt::Write;
                let _ = writeln!(text, "trace            {}", report.trace);
                let _ = writeln!(text, "backend          {}", report.backend);
                let _ = writeln!(
                    text,
                    "recording        {}",
                    record.to_possible_value().map_or("?".into(), |v| v.get_name().to_string())
                );
                let _ = writeln!(
                    text,
                    "ops              {} ({} allocs, {} frees, {} skipped)",
                    report.ops, report.allocs, report.frees, report.skipped
                );
                let _ = writeln!(text, "ns/op (cold)     {:.1}", report.cold_ns_per_op);
                let _ = writeln!(text, "ns/op (warm)     {:.1}", report.ns_per_op);
                let _ = writeln!(
                    text,
                    "peak live        {} B ({})",
                    report.peak_live_bytes,
                    report::format_bytes(report.peak_live_bytes)
                );
                let _ = writeln!(
                    text,
                    "peak reserved    {} B ({}, {:.3}x live)",
                    report.peak_reserved_bytes,
                    report::format_bytes(report.peak_reserved_bytes),
                    report.fragmentation
                );
                let _ = writeln!(
                    text,
                    "backend calls    {} segments ({} in the last warm pass), {} page maps/unmaps ({}), {} retries",
                    report.device_allocs,
                    report.warm_device_allocs,
                    report.device_maps,
                    report.warm_device_maps,
                    report.alloc_retries
                );
                let calls = &report.warm_device_calls;
                let busy = calls.iter().filter(|&&c| c > 0).count();
                let _ = match calls.iter().rposition(|&c| c > 0) {
                    None => writeln!(text, "warm passes      {} without a backend call for memory", calls.len()),
                    Some(last) => writeln!(
                        text,
                        "warm passes      {busy} of {} with backend calls for memory, the last pass {} ({} call{})",
                        calls.len(),
                        last + 1,
                        calls[last],
                        if calls[last] == 1 { "" } else { "s" }
                    ),
                };
                if let (true, Some(q)) = (report.streams > 1, report.warm_stream_queries.last()) {
                    let _ = writeln!(
                        text,
                        "stream queries   {q} in the last warm pass (whether a stream is idle, to lend memory)"
                    );
                }
                let _ = match report.fragmentation_limit {
                    Some(f) => writeln!(text, "limit in force   {f:.2}x peak allocated"),
                    None => writeln!(text, "limit in force   none"),
                };
            }
            print(&text)
        }
        Command::Fit { file, device_memory, config, warm, json } => {
            let trace = Trace::from_file(&file)?;
            let config = match config {
                Some(c) => AllocatorConfig::parse(&c)?,
                None => AllocatorConfig::from_env()?,
            };
            let device = vramscope::config::parse_bytes(&device_memory).map_err(|e| Failure(2, e.to_string()))?;
            let mut options = ReplayOptions::default();
            options.warm_passes = warm as usize;
            let mut fits = Vec::new();
            for pages in [true, false] {
                let mut c = config.clone();
                c.release_pages = pages;
                fits.push((pages, vramscope::replay::smallest_cap(&trace, &c, device, &options)?));
            }
            if json {
                let kinds: serde_json::Map<String, serde_json::Value> = fits
                    .iter()
                    .map(|(pages, f)| {
                        let key = if *pages { "virtual" } else { "cumemalloc" };
                        (key.to_string(), serde_json::to_value(f).unwrap_or_default())
                    })
                    .collect();
                let v = serde_json::json!({ "trace": file.display().to_string(), "device_memory": device, "segments": kinds });
                return print(&(v.to_string() + "\n"));
            }
            use std::fmt::Write;
            let mut text = String::new();
            let live = fits[0].1.peak_live_bytes;
            let _ = writeln!(text, "trace            {}", file.display());
            let _ = writeln!(text, "peak live        {} B ({})", live, report::format_bytes(live));
            for (pages, f) in &fits {
                let kind = if *pages { "virtual segments (the default)" } else { "cuMemAlloc segments" };
                let _ = writeln!(text, "{kind}");
                if f.fits == 0 {
                    let _ = writeln!(text, "  fits in        0 B: the trace reserves no memory");
                    continue;
                }
                let _ = writeln!(
                    text,
                    "  fits in        {} B ({}, {:.3}x live); out of memory at {} B",
                    f.fits,
                    report::format_bytes(f.fits),
                    f.ratio(),
                    f.fails
                );
                let calls = f.warm_device_calls.iter().skip(1).max().copied().unwrap_or(0);
                let _ = writeln!(
                    text,
                    "  at that cap    {}",
                    if calls == 0 {
                        "no backend call for memory after the first warm pass".to_string()
                    } else {
                        format!("up to {calls} backend calls for memory in each later warm pass")
                    }
                );
                let _ = writeln!(
                    text,
                    "  uncapped       reserves {} ({:.3}x live)",
                    report::format_bytes(f.unconstrained_reserved_bytes),
                    f.unconstrained_reserved_bytes as f64 / live.max(1) as f64
                );
            }
            print(&text)
        }
    }
}

/// An error as one line a terminal shows as it is: control characters (a newline or an escape
/// sequence a file put in a name) escaped, and at most 1,000 characters, the rest counted.
fn one_line(message: &str) -> String {
    const MOST: usize = 1000;
    let mut out = String::new();
    let mut chars = message.chars();
    for c in chars.by_ref().take(MOST) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    let rest = chars.count();
    if rest > 0 {
        out.push_str(&format!("... ({rest} more characters)"));
    }
    out
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            note(&format!("vramscope: {}\n", one_line(&message)));
            ExitCode::from(code)
        }
    }
}
