//! Chrome trace-event JSON (PyTorch's Kineto, `tracing-chrome`, chrome://tracing, Perfetto),
//! streamed: the text is read in blocks and cut into events ([`scan`]), each parsed by
//! serde_json from its slice (checked to be UTF-8 a chunk at a time) into a reused event, and
//! only each thread's stack of open spans, the step windows and per-step aggregates are kept,
//! so a trace of gigabytes takes memory in proportion to its distinct spans and steps, never to its events.
//!
//! What is read: `X` (complete: `ts`, `dur`) and `B` / `E` (begin, end) events on any number of
//! pid/tid pairs, either as the top-level array or as the `traceEvents` array of an object.
//! Timestamps are microseconds (the format's unit), or nanoseconds where the object says
//! `"displayTimeUnit": "ns"` (the unit is applied at the end, so the key may come after the
//! events). Every other phase (metadata, counters, instants, flows, async `b`/`e`) is counted
//! and skipped. Events of one thread must come in the order they start (B/E always do; Kineto
//! and chrome://tracing write `X` events sorted by `ts`); an `X` that starts before the last
//! start on its thread is refused rather than mis-nested.
//!
//! Steps (a forward pass) are spans whose name matches a pattern; a span belongs to the step it
//! is nested in on its own thread (the step's thread), or, on another thread (a worker, a track
//! of spans without a device category), to the step whose time window holds its start.
//!
//! Self time, across threads (ARCHITECTURE.md, "Traces of several threads"): a span on another
//! thread than its step's has as self time its duration less its direct children's on its
//! thread. A span on the step's thread has as self time the part of its interval covered neither
//! by its children on that thread nor by any span of another thread in the same step: while a
//! worker or a stream runs, the step's thread waits for it (or overlaps it), and that interval is
//! the worker's, never counted twice. Two other threads busy at once are work done in parallel,
//! each counted: the step's concurrency ([`StepAgg::concurrency`]) is the sum of its self times
//! over its wall. To apply this while streaming, the step thread's uncovered pieces of each step
//! are kept until the step is finished ([`RETAINED_PIECES`]), not the events.
//!
//! A trace whose event array stops without its closing `]` (a process killed while tracing) is
//! read up to its last whole event, with a note; one cut inside an event is refused.
//!
//! Device activity (Kineto's `kernel`, `gpu_memcpy`, `gpu_memset`, on a device's stream tracks)
//! is not a host thread: it is linked to the span that launched it (`args.correlation` of a
//! runtime call, else `External id`, else an `ac2g` flow) and its time is device time of that
//! launch's step, keyed by its name under the launch and the launch's context
//! ([`SpanKey::within`]); per step the union over each device's streams is its busy time.
//! Activity launched outside every step, or whose launch is never found, is counted
//! ([`DeviceTotals`]). ARCHITECTURE.md, "Device activity (Kineto)".

use rustc_hash::FxHashMap as HashMap;
use std::fmt;
use std::io::Read;

use regex::Regex;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

mod scan;
mod sort;
use scan::Scanner;
pub use sort::SORT_RUN_EVENTS;

/// Timestamps closer than this (in the trace's unit) are the same instant: `ts + dur` of a
/// child written with rounded floats may pass its parent's end by a rounding step.
const EPS: f64 = 1e-3;

/// Spans outside every step seen so far that are kept to be matched again at the end (a worker
/// thread's span written before the step that holds it); beyond this they count as outside.
const PENDING_CAP: usize = 1 << 20;

/// The step thread's pieces of self time (a span's interval outside its children) kept for the
/// steps not yet finished, waiting for spans of other threads in their window; beyond this the
/// oldest closed steps are finished (a span of another thread read after its step was finished
/// is counted as `late`: the step thread's time under it could not be removed). Small in this
/// crate's unit tests, so that they reach it quickly.
pub const RETAINED_PIECES: usize = if cfg!(test) { 1 << 10 } else { 1 << 18 };

/// Links from a launch (a runtime call's `correlation`, a CPU op's `External id`, a flow's
/// `id`) to the span that made it, kept for the device activity read later (Kineto writes the
/// device's tracks after the CPU's); beyond this many, the oldest half (by id) is let go and
/// counted ([`DeviceTotals::links_dropped`]).
pub const LINK_CAP: usize = if cfg!(test) { 1 << 8 } else { 1 << 20 };

/// Whether a category is device activity: Kineto's `kernel`, `gpu_memcpy`, `gpu_memset` (and
/// the capitalised names of older versions).
pub fn is_device_category(cat: &str) -> bool {
    ["kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"]
        .iter()
        .any(|c| cat.eq_ignore_ascii_case(c))
}

/// What identifies a span: its name, category and the arguments the rules read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct SpanKey {
    pub name: String,
    pub cat: String,
    /// The name of the span it is nested in on its thread (empty at the top).
    pub parent: String,
    /// The arguments the rules read and `Input Dims`, as `key=value` pairs (JSON values).
    pub args: Vec<(String, String)>,
    /// The names of the spans it is nested in on its thread that match the rules' `context`
    /// pattern (modules, annotations, ops), outermost first; for device activity, those of the
    /// runtime call that launched it (whose name is then `parent`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub within: Vec<String>,
}

impl SpanKey {
    /// The value of argument `key`, if the span carried it.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// One step (forward pass): its wall and the self time of every span in it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepAgg {
    pub name: String,
    pub start_us: f64,
    pub wall_us: f64,
    /// Self microseconds per span key (index into [`TraceSummary::keys`]), dense.
    pub self_us: Vec<f64>,
    /// Spans attributed to this step.
    pub spans: u64,
    /// Device microseconds per span key (the device activity a launch in this step started,
    /// keyed by the activity's name with its launch as parent), dense; empty when the trace
    /// holds no device activity.
    pub device_us: Vec<f64>,
    /// Device activities (kernels, copies, sets) launched in this step.
    pub kernels: u64,
    /// The union over each device's streams of those activities' intervals, summed over the
    /// devices: the time a device was busy with this step's work.
    pub device_busy_us: f64,
    /// The end of this step's last device activity, when it had any.
    pub device_end_us: Option<f64>,
}

impl StepAgg {
    /// The sum of the step's self times over its wall: 1 for work on one thread at a time,
    /// above 1 where threads or streams worked at once (each interval is counted once per
    /// thread that worked in it), below 1 where the step's time lies outside every span.
    pub fn concurrency(&self) -> f64 {
        if self.wall_us > 0.0 {
            self.self_us.iter().sum::<f64>() / self.wall_us
        } else {
            f64::NAN
        }
    }
}

/// What a trace held, per step.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSummary {
    pub keys: Vec<SpanKey>,
    pub steps: Vec<StepAgg>,
    /// Every event of the trace, of any phase.
    pub events: u64,
    /// Spans (X, or a B/E pair) read.
    pub spans: u64,
    /// Events of phases other than X, B and E (skipped).
    pub skipped_events: u64,
    /// Spans outside every step (warm-up, loading): not counted.
    pub outside_steps: u64,
    /// B events never closed by an E (at the end of the trace): not counted.
    pub unclosed: u64,
    /// Distinct (pid, tid) pairs with spans.
    pub threads: usize,
    /// `us` or `ns`: the unit the timestamps were read in.
    pub time_unit: String,
    /// Spans of another thread than their step's read after that step was finished (see
    /// [`RETAINED_PIECES`]): counted, but the step thread's time under them was not removed.
    pub late: u64,
    /// What the reader noticed without refusing the trace (an event array cut short).
    pub notes: Vec<String>,
    /// Device activity read (Kineto's `kernel`, `gpu_memcpy`, `gpu_memset` events on a
    /// device's stream tracks).
    pub device: DeviceTotals,
}

/// Device activity of a whole trace, beside the per-step figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DeviceTotals {
    /// Device activity events read.
    pub events: u64,
    /// Distinct devices (pids) and streams (pid, tid) they ran on.
    pub devices: usize,
    pub streams: usize,
    /// Activities whose launch lies outside every step (warm-up, loading): counted, their
    /// device time stated, not in any step.
    pub outside_steps: u64,
    pub outside_steps_us: f64,
    /// Activities whose launch was never found (no runtime call with their correlation, no
    /// CPU op with their External id, no flow): counted, their device time stated.
    pub unlinked: u64,
    pub unlinked_us: f64,
    /// Launches let go to bound memory before their activity was read (see [`LINK_CAP`]).
    pub links_dropped: u64,
}

/// How to read a trace.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// A span whose name matches is a step (the outermost on its thread).
    pub step: Regex,
    /// Argument keys kept in span keys (those the rules read), besides `Input Dims`.
    pub arg_keys: Vec<String>,
    /// Spans whose name or category matches enclose the spans nested in them as context (a
    /// step span never does): their names are kept, outermost first, in the nested spans' keys
    /// ([`SpanKey::within`]). `None`: no context is kept.
    pub context: Option<Regex>,
}

/// The default step pattern: a forward pass or a profiler step.
pub const DEFAULT_STEP_PATTERN: &str = r"(?i)^(forward|model_forward|ProfilerStep#\d+)$";

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: not valid trace JSON at byte {offset}: {why}")]
    Syntax {
        file: String,
        offset: u64,
        why: String,
    },
    #[error("{file}: event {index} (at byte {offset}) is not a valid trace event: {source}")]
    BadJson {
        file: String,
        index: u64,
        offset: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{file}: not a Chrome trace: expected an array of events or an object with `traceEvents`"
    )]
    NotATrace { file: String },
    #[error("{file}: no step span: no span name matches /{pattern}/ ({spans} spans read; most frequent names: {names}); give the pattern of a forward pass with --step")]
    NoStep {
        file: String,
        pattern: String,
        spans: u64,
        names: String,
    },
    #[error("{file}: spans overlap without nesting on {thread}: {detail}")]
    Overlap {
        file: String,
        thread: String,
        detail: String,
    },
    #[error("{file}: an E event ('{name}' at {ts}) on {thread} without a B to close")]
    EndWithoutBegin {
        file: String,
        thread: String,
        name: String,
        ts: f64,
    },
    #[error("{file}: events of {thread} are not in the order they start: {detail}; sort the trace by ts")]
    OutOfOrder {
        file: String,
        thread: String,
        detail: String,
    },
    #[error("{file}: event {index}: {why}")]
    BadEvent {
        file: String,
        index: u64,
        why: String,
    },
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: the trace stops inside event {index} (after {events} whole events): the file was cut while it was written; remove the partial event to read the rest")]
    CutInsideEvent {
        file: String,
        index: u64,
        events: u64,
    },
}

/// A pid or tid: a number or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Id {
    Num(i64),
    Str(String),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => f.write_str(s),
        }
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Id, E> {
                Ok(Id::Num(v as i64))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Id, E> {
                Ok(Id::Num(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Id, E> {
                Ok(Id::Num(v as i64))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Id, E> {
                Ok(Id::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One event as read: the fields opledger uses, and of `args` only the keys it keeps.
#[derive(Default, Clone)]
struct Event {
    name: String,
    cat: String,
    ph: u8,
    ts: Option<f64>,
    dur: Option<f64>,
    pid: Option<Id>,
    tid: Option<Id>,
    /// The kept arguments, as `key=value` text, sorted.
    args: Vec<(String, String)>,
    /// Buffers of arguments kept by an earlier event, reused (reading an event allocates
    /// nothing once they are large enough).
    spare_args: Vec<(String, String)>,
    /// `args.correlation`: a runtime call and the device activity it launched.
    correlation: Option<i64>,
    /// `args["External id"]`: a CPU op and the runtime calls and activity it led to.
    external_id: Option<i64>,
    /// The event's `id` (flow events).
    id: Option<Id>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Name,
    Cat,
    Ph,
    Ts,
    Dur,
    Pid,
    Tid,
    Args,
    Id,
    #[serde(other)]
    Other,
}

/// Reads one event into `ev` (reused from event to event: its strings keep their buffers, so
/// reading an event allocates nothing), keeping of its `args` only `keep` (the keys the rules
/// read).
struct EventSeed<'k, 'e> {
    keep: &'k [String],
    ev: &'e mut Event,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event (an object)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let ev = self.ev;
        ev.name.clear();
        ev.cat.clear();
        ev.ph = 0;
        ev.ts = None;
        ev.dur = None;
        ev.pid = None;
        ev.tid = None;
        ev.spare_args.append(&mut ev.args);
        ev.correlation = None;
        ev.external_id = None;
        ev.id = None;
        while let Some(k) = map.next_key::<Field>()? {
            match k {
                Field::Name => map.next_value_seed(StrInto(&mut ev.name))?,
                Field::Cat => map.next_value_seed(StrInto(&mut ev.cat))?,
                Field::Ph => {
                    let ph: PhaseChar = map.next_value()?;
                    ev.ph = ph.0;
                }
                Field::Ts => ev.ts = map.next_value()?,
                Field::Dur => ev.dur = map.next_value()?,
                Field::Pid => ev.pid = map.next_value()?,
                Field::Tid => ev.tid = map.next_value()?,
                Field::Args => map.next_value_seed(ArgsSeed {
                    keep: self.keep,
                    kept: &mut ev.args,
                    spare: &mut ev.spare_args,
                    correlation: &mut ev.correlation,
                    external_id: &mut ev.external_id,
                })?,
                Field::Id => ev.id = map.next_value()?,
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A string read into a buffer that is reused: the reader's own scratch text is copied, no
/// allocation once the buffer is large enough.
struct StrInto<'s>(&'s mut String);

impl<'de> DeserializeSeed<'de> for StrInto<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for StrInto<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.0.clear();
        self.0.push_str(v);
        Ok(())
    }
}

/// The phase's first byte (`X`, `B`, `E`, ...), without allocating.
struct PhaseChar(u8);

impl<'de> Deserialize<'de> for PhaseChar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PhaseChar, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PhaseChar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a phase string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PhaseChar, E> {
                Ok(PhaseChar(if v.len() == 1 { v.as_bytes()[0] } else { 0 }))
            }
        }
        d.deserialize_str(V)
    }
}

/// `args`: `Input Dims` and the keys the rules read, as text into `kept` (sorted, its strings
/// taken from `spare`); `correlation` and `External id` as numbers beside them (links, never
/// part of a span's key); the rest skipped.
struct ArgsSeed<'k, 'e> {
    keep: &'k [String],
    kept: &'e mut Vec<(String, String)>,
    spare: &'e mut Vec<(String, String)>,
    correlation: &'e mut Option<i64>,
    external_id: &'e mut Option<i64>,
}

/// A link id as Kineto writes it, from the value's JSON text: a number (or a string holding
/// one); anything else is no id.
fn link_id(raw: &str) -> Option<i64> {
    if raw.starts_with('"') {
        let s: String = serde_json::from_str(raw).ok()?;
        return s.trim().parse().ok();
    }
    raw.parse::<i64>()
        .ok()
        .or_else(|| raw.parse::<u64>().ok().map(|u| u as i64))
        .or_else(|| {
            // a number with a fraction or an exponent (other JSON values are no id)
            raw.starts_with(|c: char| c == '-' || c.is_ascii_digit())
                .then(|| raw.parse::<f64>().ok().map(|f| f as i64))
                .flatten()
        })
}

/// A kept argument's text from its value's JSON text: a string's contents, or the value written
/// compactly (`[[1,128,640],[640]]`). An array of small non-negative integers, what `Input
/// Dims` holds, is that text without its whitespace; other values go through a
/// `serde_json::Value`, which writes them compactly.
fn arg_text(raw: &str, out: &mut String) -> Result<(), serde_json::Error> {
    out.clear();
    let small_ints = raw.starts_with('[')
        && raw
            .split(|c: char| !c.is_ascii_digit())
            .all(|digits| digits.len() <= 18)
        && raw.bytes().all(|b| {
            matches!(
                b,
                b'0'..=b'9' | b'[' | b']' | b',' | b' ' | b'\t' | b'\n' | b'\r'
            )
        });
    if small_ints {
        out.extend(raw.chars().filter(|c| !c.is_ascii_whitespace()));
        return Ok(());
    }
    match serde_json::from_str(raw)? {
        serde_json::Value::String(s) => out.push_str(&s),
        other => out.push_str(&other.to_string()),
    }
    Ok(())
}

impl<'de> DeserializeSeed<'de> for ArgsSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ArgsSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an args object")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while let Some(k) = map.next_key_seed(ArgKeySeed(self.keep))? {
            match k {
                ArgKey::Correlation | ArgKey::External => {
                    let v: &serde_json::value::RawValue = map.next_value()?;
                    let id = link_id(v.get());
                    if matches!(k, ArgKey::Correlation) {
                        *self.correlation = id;
                    } else {
                        *self.external_id = id;
                    }
                }
                ArgKey::Kept(k) => {
                    let v: &serde_json::value::RawValue = map.next_value()?;
                    let (mut key, mut text) = self.spare.pop().unwrap_or_default();
                    key.clear();
                    key.push_str(k.map_or(INPUT_DIMS, |i| &self.keep[i]));
                    arg_text(v.get(), &mut text).map_err(serde::de::Error::custom)?;
                    self.kept.push((key, text));
                }
                ArgKey::Skipped => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        self.kept.sort();
        Ok(())
    }
}

/// The argument with each op's input shapes, always kept (the rules may read it).
const INPUT_DIMS: &str = "Input Dims";

/// An argument's key, sorted without allocating unless it is kept.
enum ArgKey {
    Correlation,
    External,
    /// `Input Dims` (None) or the key the rules read at this index.
    Kept(Option<usize>),
    Skipped,
}

struct ArgKeySeed<'k>(&'k [String]);

impl<'de> DeserializeSeed<'de> for ArgKeySeed<'_> {
    type Value = ArgKey;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ArgKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for ArgKeySeed<'_> {
    type Value = ArgKey;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an argument's name")
    }
    fn visit_str<E: serde::de::Error>(self, k: &str) -> Result<ArgKey, E> {
        Ok(match k {
            "correlation" => ArgKey::Correlation,
            "External id" => ArgKey::External,
            INPUT_DIMS => ArgKey::Kept(None),
            _ => match self.0.iter().position(|w| w == k) {
                Some(i) => ArgKey::Kept(Some(i)),
                None => ArgKey::Skipped,
            },
        })
    }
}

struct Frame {
    key: u32,
    start: f64,
    /// Known for X spans; set by the E of a B span.
    end: Option<f64>,
    child_sum: f64,
    /// Where the span's own time resumes: its start, then the end of its last child.
    cursor: f64,
    /// The step this span is (or is nested in) on its own thread: the span is on the step's
    /// thread, and its self time is kept as pieces until the step is finished.
    step: Option<usize>,
    /// This span is the step.
    is_step: bool,
    /// The context path of the spans nested in it (its own, with its name when it is a
    /// context span).
    ctx: u32,
}

#[derive(Default)]
struct Thread {
    stack: Vec<Frame>,
    last_start: f64,
}

struct StepWin {
    name: String,
    start: f64,
    end: Option<f64>,
    self_by_key: HashMap<u32, f64>,
    spans: u64,
    /// The step thread's self time as (key, from, to), until the step is finished.
    pieces: Vec<(u32, f64, f64)>,
    /// Intervals where spans of other threads in this step ran (their outermost spans).
    busy: Vec<(f64, f64)>,
    /// The pieces were reduced by the busy intervals into `self_by_key`.
    finished: bool,
    /// Device time per key of the activity this step launched.
    device_by_key: HashMap<u32, f64>,
    /// (device, start, end) of that activity, merged whenever it doubles.
    device_iv: Vec<(u32, f64, f64)>,
    /// The length of `device_iv` after its last merge.
    device_merged: usize,
    kernels: u64,
    device_end: Option<f64>,
}

/// Sorts and merges per device the intervals `(device, start, end)`: what is left is disjoint
/// per device, so the sum of its lengths is the devices' busy time.
fn merge_per_device(iv: &mut Vec<(u32, f64, f64)>) {
    iv.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut out: Vec<(u32, f64, f64)> = Vec::with_capacity(iv.len());
    for &(d, s, e) in iv.iter() {
        match out.last_mut() {
            Some(last) if last.0 == d && s <= last.2 => last.2 = last.2.max(e),
            _ => out.push((d, s, e)),
        }
    }
    *iv = out;
}

/// A launch: the span that made it (its key) and that span's step.
#[derive(Clone, Copy)]
struct Launch {
    key: u32,
    step: Option<usize>,
}

/// Launches by id, bounded: past [`LINK_CAP`] entries the older half (by id) is let go. Ids
/// come mostly in increasing order (Kineto numbers correlations and External ids as it goes):
/// those are appended to a sorted list and found by binary search; the others are kept in a
/// map (a hash map alone spent a fifth of the state's time in cache misses over a million
/// entries). Every key of the map is below the list's last id, so an id after it is in neither,
/// and the two never hold the same id: together they are one map of the ids.
#[derive(Default)]
struct Links {
    sorted: std::collections::VecDeque<(i64, Launch)>,
    map: HashMap<i64, Launch>,
    newest: i64,
    dropped: u64,
}

impl Links {
    fn insert(&mut self, id: i64, l: Launch) {
        self.newest = self.newest.max(id);
        if self.sorted.back().is_none_or(|&(last, _)| id > last) {
            self.sorted.push_back((id, l));
        } else if let Ok(i) = self.position(id) {
            self.sorted[i].1 = l;
        } else {
            self.map.insert(id, l);
        }
        let len = self.sorted.len() + self.map.len();
        if len > LINK_CAP {
            // the list's last id is the newest (or, with only negative ids, the list goes whole
            // and the map's keys, all below it, with it)
            let cut = self.newest - (LINK_CAP / 2) as i64;
            let older = self.sorted.partition_point(|e| e.0 <= cut);
            self.sorted.drain(..older);
            self.map.retain(|&k, _| k > cut);
            self.dropped += (len - self.sorted.len() - self.map.len()) as u64;
        }
    }

    /// Where `id` is in the list (or would be): where it lies if the ids from the first are
    /// consecutive, as Kineto's mostly are, else by binary search.
    fn position(&self, id: i64) -> Result<usize, usize> {
        if let Some(&(first, _)) = self.sorted.front() {
            let guess = id.checked_sub(first).and_then(|d| usize::try_from(d).ok());
            if let Some(i) = guess.filter(|&i| self.sorted.get(i).is_some_and(|e| e.0 == id)) {
                return Ok(i);
            }
        }
        self.sorted.binary_search_by_key(&id, |e| e.0)
    }

    fn get(&self, id: i64) -> Option<Launch> {
        match self.position(id) {
            Ok(i) => Some(self.sorted[i].1),
            Err(_) => self.map.get(&id).copied(),
        }
    }
}

/// Device activity whose launch was not yet read: linked at the end (by its correlation, its
/// External id, or the flow that ends at its start).
struct PendingActivity {
    key_name: u32,
    key_cat: u32,
    args: Vec<(String, String)>,
    correlation: Option<i64>,
    external_id: Option<i64>,
    flow: Option<i64>,
    device: u32,
    start: f64,
    end: f64,
}

impl StepWin {
    /// Removes from the step thread's self times (already in `self_by_key`) each piece's overlap
    /// with the intervals where another thread's span ran; the pieces and intervals are let go.
    /// A step no other thread worked in has nothing to remove.
    fn finish(&mut self) {
        let mut busy = std::mem::take(&mut self.busy);
        let pieces = std::mem::take(&mut self.pieces);
        if !busy.is_empty() {
            busy.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut merged: Vec<(f64, f64)> = Vec::with_capacity(busy.len());
            for (s, e) in busy {
                match merged.last_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => merged.push((s, e)),
                }
            }
            for (key, a, b) in pieces {
                // the merged intervals are disjoint and sorted: those ending after `a`
                let first = merged.partition_point(|&(_, e)| e <= a);
                let mut covered = 0.0;
                for &(s, e) in &merged[first..] {
                    if s >= b {
                        break;
                    }
                    covered += e.min(b) - s.max(a);
                }
                if covered > 0.0 {
                    let v = self.self_by_key.entry(key).or_default();
                    *v = (*v - covered).max(0.0);
                }
            }
        }
        self.finished = true;
    }
}

/// A span key by interned ids: (name, category, parent's name, context path) and a hash of its
/// kept arguments; the keys of that hash with their arguments (one, but for a hash collision).
type KeyIds = (u32, u32, u32, u32, u64);
type KeysOf = Vec<(Vec<(String, String)>, u32)>;

/// The hash of a span's kept arguments (0 for none, as most spans have).
fn args_hash(args: &[(String, String)]) -> u64 {
    use std::hash::BuildHasher;
    if args.is_empty() {
        return 0;
    }
    rustc_hash::FxBuildHasher.hash_one(args)
}

/// The state the visitor feeds, event by event.
struct State<'o> {
    file: String,
    opts: &'o TraceOptions,
    /// Every distinct name and category, interned (id 0 is the empty string).
    strings: HashMap<String, u32>,
    /// The interned strings by id.
    string_list: Vec<String>,
    /// Per key: 0 not yet asked, 1 a context span, 2 not.
    is_context: Vec<u8>,
    /// Context paths: (enclosing path, name id); path 0 is the empty path.
    paths: Vec<(u32, u32)>,
    path_ids: HashMap<(u32, u32), u32>,
    /// Per key: its context path.
    key_within: Vec<u32>,
    /// (name, category, parent's name, context path, arguments' hash) -> span keys, looked up
    /// without building a [`SpanKey`] (no allocation for a span seen before).
    key_ids: HashMap<KeyIds, KeysOf>,
    /// Per key: its name's id (what the spans nested in it see as their parent).
    key_name: Vec<u32>,
    keys: Vec<SpanKey>,
    name_counts: Vec<u64>,
    thread_ids: HashMap<(Id, Id), usize>,
    /// Per thread, in the order first seen; `tid_names[i]` is thread i's (pid, tid).
    threads: Vec<Thread>,
    tid_names: Vec<(Id, Id)>,
    /// The last thread looked up (consecutive events are mostly of one thread).
    last_thread: Option<usize>,
    steps: Vec<StepWin>,
    /// Steps before this one are finished (their pieces reduced).
    first_unfinished: usize,
    /// Pieces held by unfinished steps.
    retained: usize,
    /// Spans outside every step seen so far: (start, end, key, self time, outermost on its
    /// thread).
    pending: Vec<(f64, f64, u32, f64, bool)>,
    late: u64,
    events: u64,
    spans: u64,
    skipped: u64,
    outside: u64,
    unclosed: u64,
    /// Launches by correlation (runtime calls, flow starts) and by External id (CPU ops).
    by_correlation: Links,
    by_external: Links,
    /// Device streams (pid, tid) -> (stream, device), devices by pid.
    streams: HashMap<(Id, Id), (u32, u32)>,
    devices: HashMap<Id, u32>,
    last_stream: Option<((Id, Id), (u32, u32))>,
    pending_device: Vec<PendingActivity>,
    /// Pending activity by (stream, start bits): where a flow's end finds it.
    pending_at: HashMap<(u32, u64), usize>,
    device: DeviceTotals,
    /// Device activity was read (the steps' device figures are kept).
    any_device: bool,
    /// Spans clipped at a step's boundary they crossed (see [`State::begin`]).
    clipped: u64,
    /// Events sorted by start before they are read ([`read_chrome_sorted`]).
    buffer: Option<sort::Sorter>,
}

impl<'o> State<'o> {
    /// An event read: fed to the state, or held to be sorted.
    fn take(&mut self, ev: &mut Event) -> Result<(), TraceError> {
        match &mut self.buffer {
            Some(buffer) => buffer.push(ev),
            None => self.event(ev),
        }
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.insert(s.to_string(), id);
        self.string_list.push(s.to_string());
        id
    }

    /// Whether spans of key `key` are context for the spans nested in them: the context
    /// pattern matches their name or their category.
    fn context_key(&mut self, key: u32) -> bool {
        let Some(re) = &self.opts.context else {
            return false;
        };
        let i = key as usize;
        if self.is_context.len() <= i {
            self.is_context.resize(i + 1, 0);
        }
        if self.is_context[i] == 0 {
            let k = &self.keys[i];
            self.is_context[i] = if re.is_match(&k.name) || re.is_match(&k.cat) {
                1
            } else {
                2
            };
        }
        self.is_context[i] == 1
    }

    /// The path `within` extended by the name `name`.
    fn path(&mut self, within: u32, name: u32) -> u32 {
        if let Some(&p) = self.path_ids.get(&(within, name)) {
            return p;
        }
        let p = self.paths.len() as u32;
        self.paths.push((within, name));
        self.path_ids.insert((within, name), p);
        p
    }

    /// The names of a context path, outermost first.
    fn path_names(&self, mut p: u32) -> Vec<String> {
        let mut out = Vec::new();
        while p != 0 {
            let (up, name) = self.paths[p as usize];
            out.push(self.string_list[name as usize].clone());
            p = up;
        }
        out.reverse();
        out
    }

    fn key_of(&mut self, ev: &mut Event, tid: usize, ts: f64) -> u32 {
        self.close_until(tid, ts);
        let (parent, within) = match self.threads[tid].stack.last() {
            Some(f) => (Some(f.key), f.ctx),
            None => (None, 0),
        };
        let name = self.intern(&ev.name);
        let cat = self.intern(&ev.cat);
        self.key(name, cat, parent, within, &ev.args)
    }

    /// The key of (name, category, parent key, context path, kept arguments), added when new.
    fn key(
        &mut self,
        name: u32,
        cat: u32,
        parent: Option<u32>,
        within: u32,
        args: &[(String, String)],
    ) -> u32 {
        let ids = (
            name,
            cat,
            parent.map_or(0, |p| self.key_name[p as usize]),
            within,
            args_hash(args),
        );
        if let Some(keys) = self.key_ids.get(&ids) {
            if let Some(&(_, id)) = keys.iter().find(|(a, _)| a == args) {
                return id;
            }
        }
        let id = self.keys.len() as u32;
        self.keys.push(SpanKey {
            name: self.string_list[name as usize].clone(),
            cat: self.string_list[cat as usize].clone(),
            parent: parent.map_or(String::new(), |p| self.keys[p as usize].name.clone()),
            args: args.to_vec(),
            within: self.path_names(within),
        });
        self.key_name.push(name);
        self.key_within.push(within);
        self.name_counts.push(0);
        self.key_ids
            .entry(ids)
            .or_default()
            .push((args.to_vec(), id));
        id
    }

    /// The index of thread `tid`, added when new.
    fn thread(&mut self, tid: (Id, Id)) -> usize {
        if let Some(i) = self.last_thread {
            if self.tid_names[i] == tid {
                return i;
            }
        }
        let i = match self.thread_ids.get(&tid) {
            Some(&i) => i,
            None => {
                let i = self.threads.len();
                self.threads.push(Thread::default());
                self.tid_names.push(tid.clone());
                self.thread_ids.insert(tid, i);
                i
            }
        };
        self.last_thread = Some(i);
        i
    }

    fn event(&mut self, ev: &mut Event) -> Result<(), TraceError> {
        let index = self.events;
        self.events += 1;
        let ph = ev.ph;
        if !matches!(ph, b'X' | b'B' | b'E') {
            self.skipped += 1;
            if matches!(ph, b's' | b'f') && ev.cat == "ac2g" {
                self.flow(ev);
            }
            return Ok(());
        }
        if ev.cat.eq_ignore_ascii_case("gpu_user_annotation") {
            // an annotation's extent on a device's track: the activity under it is read
            // itself, with the annotation around its launch
            self.skipped += 1;
            return Ok(());
        }
        let file = &self.file;
        let bad = |why: &str| TraceError::BadEvent {
            file: file.clone(),
            index,
            why: why.to_string(),
        };
        let ts = ev.ts.ok_or_else(|| bad("a span event without `ts`"))?;
        if !ts.is_finite() {
            return Err(bad("a `ts` that is not a finite number"));
        }
        let (ts, dur) = match ph {
            b'X' => {
                let dur = ev.dur.ok_or_else(|| bad("an X event without `dur`"))?;
                if !dur.is_finite() || dur < 0.0 {
                    return Err(bad("a `dur` that is negative or not a finite number"));
                }
                (ts, dur)
            }
            _ => (ts, 0.0),
        };
        if ph == b'X' && is_device_category(&ev.cat) {
            self.device_activity(ev, ts, dur);
            return Ok(());
        }
        let tid = self.thread((
            ev.pid.take().unwrap_or(Id::Num(0)),
            ev.tid.take().unwrap_or(Id::Num(0)),
        ));
        match ph {
            b'X' => {
                let key = self.key_of(ev, tid, ts);
                self.begin(tid, key, ts, Some(ts + dur))?;
                self.register_launch(tid, ev);
                Ok(())
            }
            b'B' => {
                let key = self.key_of(ev, tid, ts);
                self.begin(tid, key, ts, None)?;
                self.register_launch(tid, ev);
                Ok(())
            }
            _ => self.end(tid, &ev.name, ts),
        }
    }

    /// A span just opened on `tid` that carries a `correlation` (a runtime call) or an
    /// `External id` (a CPU op): the device activity with that id was launched by it.
    fn register_launch(&mut self, tid: usize, ev: &Event) {
        if ev.correlation.is_none() && ev.external_id.is_none() {
            return;
        }
        let Some(f) = self.threads[tid].stack.last() else {
            return;
        };
        let (key, start, step) = (f.key, f.start, f.step);
        let launch = Launch {
            key,
            step: step.or_else(|| self.window_of(start)),
        };
        if let Some(c) = ev.correlation {
            self.by_correlation.insert(c, launch);
        }
        if let Some(e) = ev.external_id {
            self.by_external.insert(e, launch);
        }
    }

    /// A flow event of Kineto's `ac2g` (a launch to its device activity): its start (`s`) on
    /// a CPU thread names the innermost open span there as the launch of flow `id`, unless a
    /// runtime call already did with that correlation; its end (`f`) at the start of a device
    /// activity still waiting for its launch gives that activity the flow's id.
    fn flow(&mut self, ev: &mut Event) {
        let (Some(ts), Some(id)) = (ev.ts, ev.id.as_ref()) else {
            return;
        };
        let id = match id {
            Id::Num(n) => *n,
            Id::Str(s) => match s.trim().parse() {
                Ok(n) => n,
                Err(_) => return,
            },
        };
        let pid = ev.pid.take().unwrap_or(Id::Num(0));
        let tid = ev.tid.take().unwrap_or(Id::Num(0));
        if ev.ph == b's' {
            if self.by_correlation.get(id).is_some() {
                return;
            }
            let Some(&t) = self.thread_ids.get(&(pid, tid)) else {
                return;
            };
            self.close_until(t, ts);
            let Some(f) = self.threads[t].stack.last() else {
                return;
            };
            let (key, start, step) = (f.key, f.start, f.step);
            let launch = Launch {
                key,
                step: step.or_else(|| self.window_of(start)),
            };
            self.by_correlation.insert(id, launch);
        } else if let Some(&(stream, _)) = self.streams.get(&(pid, tid)) {
            if let Some(&i) = self.pending_at.get(&(stream, ts.to_bits())) {
                self.pending_device[i].flow = Some(id);
            }
        }
    }

    /// The (stream, device) indices of a device track.
    fn stream(&mut self, pid: Id, tid: Id) -> (u32, u32) {
        if let Some((k, v)) = &self.last_stream {
            if k.0 == pid && k.1 == tid {
                return *v;
            }
        }
        let n = self.devices.len() as u32;
        let device = *self.devices.entry(pid.clone()).or_insert(n);
        let n = self.streams.len() as u32;
        let v = *self
            .streams
            .entry((pid.clone(), tid.clone()))
            .or_insert((n, device));
        self.last_stream = Some(((pid, tid), v));
        v
    }

    /// A kernel, copy or set on a device's stream: its time goes to the step of the span that
    /// launched it, keyed by its name under that span (the rules read the launch's context).
    fn device_activity(&mut self, ev: &mut Event, ts: f64, dur: f64) {
        self.device.events += 1;
        self.any_device = true;
        let (stream, device) = self.stream(
            ev.pid.take().unwrap_or(Id::Num(0)),
            ev.tid.take().unwrap_or(Id::Num(0)),
        );
        let name = self.intern(&ev.name);
        let cat = self.intern(&ev.cat);
        let launch = ev
            .correlation
            .and_then(|c| self.by_correlation.get(c))
            .or_else(|| ev.external_id.and_then(|e| self.by_external.get(e)));
        match launch {
            Some(l) => self.attribute(l, name, cat, &ev.args, device, ts, ts + dur),
            None if self.pending_device.len() < PENDING_CAP => {
                self.pending_at
                    .insert((stream, ts.to_bits()), self.pending_device.len());
                self.pending_device.push(PendingActivity {
                    key_name: name,
                    key_cat: cat,
                    args: std::mem::take(&mut ev.args),
                    correlation: ev.correlation,
                    external_id: ev.external_id,
                    flow: None,
                    device,
                    start: ts,
                    end: ts + dur,
                });
            }
            None => {
                self.device.unlinked += 1;
                self.device.unlinked_us += dur;
            }
        }
    }

    /// Device activity `name` of `launch`, on `device` from `start` to `end`.
    #[allow(clippy::too_many_arguments)]
    fn attribute(
        &mut self,
        launch: Launch,
        name: u32,
        cat: u32,
        args: &[(String, String)],
        device: u32,
        start: f64,
        end: f64,
    ) {
        let Some(step) = launch.step else {
            self.device.outside_steps += 1;
            self.device.outside_steps_us += end - start;
            return;
        };
        let within = self.key_within[launch.key as usize];
        let key = self.key(name, cat, Some(launch.key), within, args);
        self.name_counts[key as usize] += 1;
        let w = &mut self.steps[step];
        *w.device_by_key.entry(key).or_default() += end - start;
        w.kernels += 1;
        w.device_end = Some(w.device_end.map_or(end, |e| e.max(end)));
        w.device_iv.push((device, start, end));
        if w.device_iv.len() >= 2 * w.device_merged.max(1024) {
            merge_per_device(&mut w.device_iv);
            w.device_merged = w.device_iv.len();
        }
    }

    fn thread_label(&self, tid: usize) -> String {
        let (p, t) = &self.tid_names[tid];
        format!("pid {p} tid {t}")
    }

    fn overlap(&self, tid: usize, outer: &Frame, inner: u32, s: f64, e: f64) -> TraceError {
        TraceError::Overlap {
            file: self.file.clone(),
            thread: self.thread_label(tid),
            detail: format!(
                "'{}' ({s}..{e}) starts inside '{}' ({}..{}) and ends after it",
                self.keys[inner as usize].name,
                self.keys[outer.key as usize].name,
                outer.start,
                outer.end.unwrap_or(f64::NAN)
            ),
        }
    }

    /// Closes the thread's spans that ended by `t` (X spans).
    fn close_until(&mut self, tid: usize, t: f64) {
        loop {
            let th = &mut self.threads[tid];
            match th.stack.last() {
                Some(Frame { end: Some(e), .. }) if *e <= t + EPS => {
                    let f = th.stack.pop().expect("non-empty");
                    self.finish(tid, f);
                }
                _ => return,
            }
        }
    }

    fn begin(&mut self, tid: usize, key: u32, s: f64, end: Option<f64>) -> Result<(), TraceError> {
        self.spans += 1;
        self.name_counts[key as usize] += 1;
        let th = &mut self.threads[tid];
        if !th.stack.is_empty() && s + EPS < th.last_start {
            let previous = th.last_start;
            return Err(TraceError::OutOfOrder {
                file: self.file.clone(),
                thread: self.thread_label(tid),
                detail: format!(
                    "'{}' at {s} comes after a span starting at {previous}",
                    self.keys[key as usize].name
                ),
            });
        }
        th.last_start = th.last_start.max(s);
        self.close_until(tid, s);
        let mut end = end;
        let parent_step = self.threads[tid].stack.last().and_then(|f| f.step);
        let opens_step =
            parent_step.is_none() && self.opts.step.is_match(&self.keys[key as usize].name);
        if let Some(e) = end {
            if let Some(step_end) = parent_step.and_then(|p| self.steps[p].end) {
                // a span that starts in a step and would outlive it (the profiler's own Python
                // frame that closes the step annotation) ends with the step
                if e > step_end + EPS {
                    end = Some(step_end.max(s));
                    self.clipped += 1;
                }
            } else if opens_step {
                // a step annotation opened inside spans that end inside it (the profiler's own
                // Python frames that open it): they end where the step starts
                loop {
                    let th = &mut self.threads[tid];
                    match th.stack.last() {
                        Some(Frame {
                            end: Some(te),
                            is_step: false,
                            ..
                        }) if *te + EPS < e => {
                            let mut f = th.stack.pop().expect("non-empty");
                            f.end = Some(s.max(f.start));
                            self.clipped += 1;
                            self.finish(tid, f);
                        }
                        _ => break,
                    }
                }
            }
        }
        let parent_ctx = self.threads[tid].stack.last().map_or(0, |f| f.ctx);
        if let (Some(top), Some(e)) = (self.threads[tid].stack.last(), end) {
            if top.end.is_some_and(|te| e > te + EPS) {
                return Err(self.overlap(tid, top, key, s, e));
            }
        }
        let mut is_step = false;
        let step = match parent_step {
            Some(p) => Some(p),
            None if opens_step => {
                self.steps.push(StepWin {
                    name: self.keys[key as usize].name.clone(),
                    start: s,
                    end,
                    self_by_key: HashMap::default(),
                    spans: 0,
                    pieces: Vec::new(),
                    busy: Vec::new(),
                    finished: false,
                    device_by_key: HashMap::default(),
                    device_iv: Vec::new(),
                    device_merged: 0,
                    kernels: 0,
                    device_end: None,
                });
                is_step = true;
                Some(self.steps.len() - 1)
            }
            None => None,
        };
        // the step itself is no context: its name differs from step to step
        let ctx = if !is_step && self.context_key(key) {
            self.path(parent_ctx, self.key_name[key as usize])
        } else {
            parent_ctx
        };
        let th = &mut self.threads[tid];
        th.stack.push(Frame {
            key,
            start: s,
            end,
            child_sum: 0.0,
            cursor: s,
            step,
            is_step,
            ctx,
        });
        Ok(())
    }

    fn end(&mut self, tid: usize, name: &str, t: f64) -> Result<(), TraceError> {
        let end_without_begin = |st: &Self| TraceError::EndWithoutBegin {
            file: st.file.clone(),
            thread: st.thread_label(tid),
            name: name.to_string(),
            ts: t,
        };
        self.close_until(tid, t);
        let th = &self.threads[tid];
        let Some(top) = th.stack.last() else {
            return Err(end_without_begin(self));
        };
        if let Some(te) = top.end {
            // an X span still open at this E began inside the B span it closes and ends after it
            let (k, s) = (top.key, top.start);
            let Some(outer) = th.stack.iter().rev().find(|f| f.end.is_none()) else {
                return Err(end_without_begin(self));
            };
            let outer = Frame {
                key: outer.key,
                start: outer.start,
                end: Some(t),
                child_sum: 0.0,
                cursor: outer.start,
                step: None,
                is_step: false,
                ctx: 0,
            };
            return Err(self.overlap(tid, &outer, k, s, te));
        }
        let top_name = &self.keys[top.key as usize].name;
        if !name.is_empty() && name != top_name {
            // the E closes a span other than the innermost open one
            let inner = th
                .stack
                .iter()
                .rev()
                .find(|f| self.keys[f.key as usize].name == name);
            return Err(TraceError::Overlap {
                file: self.file.clone(),
                thread: self.thread_label(tid),
                detail: format!(
                    "an E of '{name}'{} at {t} closes it while '{top_name}' (from {}), opened inside it, is still open",
                    inner.map_or(String::new(), |f| format!(" (from {})", f.start)),
                    top.start
                ),
            });
        }
        if t + EPS < top.start {
            return Err(end_without_begin(self));
        }
        let mut f = self.threads[tid].stack.pop().expect("non-empty");
        f.end = Some(t.max(f.start));
        self.finish(tid, f);
        Ok(())
    }

    /// A span closed: its self time goes to its step, its duration to its parent. On the step's
    /// thread the pieces of its self time (the gaps between its children) are kept until the
    /// step is finished, to remove from it where other threads ran; on another thread, an
    /// outermost span marks its interval busy in its step.
    fn finish(&mut self, tid: usize, f: Frame) {
        let end = f.end.expect("closed spans have an end");
        let dur = end - f.start;
        let self_time = (dur - f.child_sum).max(0.0);
        let th = &mut self.threads[tid];
        let outermost = th.stack.is_empty();
        let mut parent_piece = None;
        if let Some(parent) = th.stack.last_mut() {
            parent.child_sum += dur;
            if let Some(step) = parent.step {
                parent_piece = Some((step, parent.key, parent.cursor, f.start));
            }
            parent.cursor = parent.cursor.max(end);
        }
        if let Some((step, key, a, b)) = parent_piece {
            self.piece(step, key, a, b);
        }
        if let (true, Some(step)) = (f.is_step, f.step) {
            self.steps[step].end = Some(end);
        }
        if let Some(step) = f.step {
            self.piece(step, f.key, f.cursor, end);
            let w = &mut self.steps[step];
            *w.self_by_key.entry(f.key).or_default() += self_time;
            w.spans += 1;
            if f.is_step {
                self.finish_closed_steps();
            }
            return;
        }
        match self.window_of(f.start) {
            Some(i) => self.other_thread(i, f.key, self_time, outermost.then_some((f.start, end))),
            None if self.pending.len() < PENDING_CAP => self
                .pending
                .push((f.start, end, f.key, self_time, outermost)),
            None => self.outside += 1,
        }
    }

    /// A piece of the step thread's self time, kept until its step is finished (a step is
    /// finished only once closed, after every span of its own thread).
    fn piece(&mut self, step: usize, key: u32, a: f64, b: f64) {
        let w = &mut self.steps[step];
        if b - a > 0.0 && !w.finished {
            w.pieces.push((key, a, b));
            self.retained += 1;
        }
    }

    /// A span of another thread in step `step`: its self time, and (outermost on its thread)
    /// the interval the step's thread waited for it.
    fn other_thread(&mut self, step: usize, key: u32, self_time: f64, busy: Option<(f64, f64)>) {
        let w = &mut self.steps[step];
        *w.self_by_key.entry(key).or_default() += self_time;
        w.spans += 1;
        if let Some(interval) = busy {
            if w.finished {
                self.late += 1;
            } else {
                w.busy.push(interval);
            }
        }
    }

    /// Finishes the oldest closed steps while more pieces are held than [`RETAINED_PIECES`].
    fn finish_closed_steps(&mut self) {
        while self.retained > RETAINED_PIECES && self.first_unfinished < self.steps.len() {
            let w = &mut self.steps[self.first_unfinished];
            if w.end.is_none() {
                // a step still open holds the rest: it is finished at the end
                return;
            }
            self.retained -= w.pieces.len();
            w.finish();
            self.first_unfinished += 1;
        }
    }

    /// The step whose window holds `t` (most recent first: steps come in time order).
    fn window_of(&self, t: f64) -> Option<usize> {
        self.steps
            .iter()
            .enumerate()
            .rev()
            .take(64)
            .find(|(_, w)| t + EPS >= w.start && w.end.is_none_or(|e| t < e))
            .map(|(i, _)| i)
    }

    fn into_summary(mut self, unit_scale: f64, unit: &str) -> Result<TraceSummary, TraceError> {
        // close what is left: X spans end, B spans never closed are dropped
        for tid in 0..self.threads.len() {
            loop {
                let th = &mut self.threads[tid];
                let Some(f) = th.stack.pop() else { break };
                if f.end.is_some() {
                    self.finish(tid, f);
                } else {
                    self.unclosed += 1;
                    // its children's durations were counted against it only
                }
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for (start, end, key, self_time, outermost) in pending {
            let found = self
                .steps
                .iter()
                .position(|w| w.end.is_some_and(|e| start + EPS >= w.start && start < e));
            match found {
                Some(i) => self.other_thread(i, key, self_time, outermost.then_some((start, end))),
                None => self.outside += 1,
            }
        }
        let pending = std::mem::take(&mut self.pending_device);
        self.pending_at.clear();
        for p in pending {
            let launch = p
                .correlation
                .and_then(|c| self.by_correlation.get(c))
                .or_else(|| p.external_id.and_then(|e| self.by_external.get(e)))
                .or_else(|| p.flow.and_then(|f| self.by_correlation.get(f)));
            match launch {
                Some(l) => {
                    self.attribute(l, p.key_name, p.key_cat, &p.args, p.device, p.start, p.end)
                }
                None => {
                    self.device.unlinked += 1;
                    self.device.unlinked_us += p.end - p.start;
                }
            }
        }
        let closed: Vec<StepWin> = std::mem::take(&mut self.steps)
            .into_iter()
            .filter(|w| w.end.is_some())
            .map(|mut w| {
                if !w.finished {
                    w.finish();
                }
                w
            })
            .collect();
        if closed.is_empty() {
            let mut counts: Vec<(u64, &str)> = self
                .name_counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(k, c)| (*c, self.keys[k].name.as_str()))
                .collect();
            counts.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
            let names: Vec<String> = counts
                .iter()
                .take(5)
                .map(|(c, n)| format!("'{n}' x{c}"))
                .collect();
            return Err(TraceError::NoStep {
                file: self.file,
                pattern: self.opts.step.as_str().to_string(),
                spans: self.spans,
                names: if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                },
            });
        }
        let n = self.keys.len();
        let any_device = self.any_device;
        let steps = closed
            .into_iter()
            .map(|mut w| {
                let mut self_us = vec![0.0; n];
                for (k, v) in w.self_by_key {
                    self_us[k as usize] = v * unit_scale;
                }
                let mut device_us = if any_device { vec![0.0; n] } else { Vec::new() };
                for (k, v) in w.device_by_key {
                    device_us[k as usize] = v * unit_scale;
                }
                merge_per_device(&mut w.device_iv);
                let busy: f64 = w.device_iv.iter().map(|(_, s, e)| e - s).sum();
                StepAgg {
                    name: w.name,
                    start_us: w.start * unit_scale,
                    wall_us: (w.end.expect("closed") - w.start) * unit_scale,
                    self_us,
                    spans: w.spans,
                    device_us,
                    kernels: w.kernels,
                    device_busy_us: busy * unit_scale,
                    device_end_us: w.device_end.map(|e| e * unit_scale),
                }
            })
            .collect();
        let mut device = self.device.clone();
        device.devices = self.devices.len();
        device.streams = self.streams.len();
        device.outside_steps_us *= unit_scale;
        device.unlinked_us *= unit_scale;
        device.links_dropped = self.by_correlation.dropped + self.by_external.dropped;
        Ok(TraceSummary {
            keys: self.keys,
            steps,
            events: self.events,
            spans: self.spans,
            skipped_events: self.skipped,
            outside_steps: self.outside,
            unclosed: self.unclosed,
            threads: self.threads.len(),
            time_unit: unit.to_string(),
            late: self.late,
            notes: Vec::new(),
            device,
        })
    }
}

/// How the event array ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// At its closing `]`.
    Closed,
    /// The text stopped between whole events.
    BetweenEvents,
    /// The text stopped inside an event.
    InsideEvent,
}

/// What the top level held besides the events.
struct Top {
    /// `displayTimeUnit`.
    unit: Option<String>,
    /// How the event array ended (None: no event array).
    cut: Option<Cut>,
    /// Whole events read.
    read: u64,
}

/// A syntax error at `offset` of the text.
fn syntax(file: &str, offset: u64, why: impl Into<String>) -> TraceError {
    TraceError::Syntax {
        file: file.to_string(),
        offset,
        why: why.into(),
    }
}

/// What is done with each event's text: `(text, index, byte offset)`.
type Sink<'s> = dyn FnMut(&[u8], u64, u64) -> Result<(), TraceError> + 's;

/// Reads the top level: an array of events, or an object with `traceEvents` (any other key
/// skipped, `displayTimeUnit` kept, wherever it comes), handing each event's text to `sink`.
fn read_top<R: Read>(sc: &mut Scanner<R>, file: &str, sink: &mut Sink) -> Result<Top, TraceError> {
    let io = |source| TraceError::Io {
        file: file.to_string(),
        source,
    };
    let mut top = Top {
        unit: None,
        cut: None,
        read: 0,
    };
    match sc.peek().map_err(io)? {
        Some(b'[') => {
            sc.bump();
            top.cut = Some(read_events(sc, file, sink, &mut top.read)?);
        }
        Some(b'{') => {
            sc.bump();
            let mut first = true;
            loop {
                let at = sc.offset();
                match sc.peek().map_err(io)? {
                    Some(b'}') if first => {
                        sc.bump();
                        break;
                    }
                    Some(b'"') => {}
                    Some(_) => return Err(syntax(file, at, "expected a key (a string)")),
                    None => return Err(syntax(file, at, "the text stops inside the object")),
                }
                first = false;
                let key: String = match sc.value().map_err(io)? {
                    Some(v) => {
                        serde_json::from_slice(v).map_err(|e| syntax(file, at, e.to_string()))?
                    }
                    None => return Err(syntax(file, at, "the text stops inside a key")),
                };
                let at = sc.offset();
                if sc.peek().map_err(io)? != Some(b':') {
                    return Err(syntax(
                        file,
                        at,
                        format!("expected `:` after the key \"{key}\""),
                    ));
                }
                sc.bump();
                let at = sc.offset();
                let Some(b) = sc.peek().map_err(io)? else {
                    return Err(syntax(
                        file,
                        at,
                        format!("the text stops before the value of \"{key}\""),
                    ));
                };
                if key == "traceEvents" {
                    if b != b'[' {
                        return Err(syntax(file, at, "`traceEvents` is not an array"));
                    }
                    sc.bump();
                    let cut = read_events(sc, file, sink, &mut top.read)?;
                    top.cut = Some(cut);
                    if cut != Cut::Closed {
                        return Ok(top);
                    }
                } else {
                    let Some(v) = sc.value().map_err(io)? else {
                        return Err(syntax(
                            file,
                            at,
                            format!("the text stops inside the value of \"{key}\""),
                        ));
                    };
                    if key == "displayTimeUnit" {
                        top.unit =
                            Some(serde_json::from_slice(v).map_err(|e| {
                                syntax(file, at, format!("`displayTimeUnit`: {e}"))
                            })?);
                    }
                }
                let at = sc.offset();
                match sc.peek().map_err(io)? {
                    Some(b',') => sc.bump(),
                    Some(b'}') => {
                        sc.bump();
                        break;
                    }
                    Some(_) => return Err(syntax(file, at, "expected `,` or `}` after a value")),
                    None => {
                        return Err(syntax(
                            file,
                            at,
                            "the text stops before the object's closing `}`",
                        ))
                    }
                }
            }
        }
        _ => return Ok(top),
    }
    let at = sc.offset();
    if sc.peek().map_err(io)?.is_some() {
        return Err(syntax(file, at, "text after the trace's end"));
    }
    Ok(top)
}

/// Reads the event array after its `[`, handing each event's text to `sink`.
fn read_events<R: Read>(
    sc: &mut Scanner<R>,
    file: &str,
    sink: &mut Sink,
    read: &mut u64,
) -> Result<Cut, TraceError> {
    let io = |source| TraceError::Io {
        file: file.to_string(),
        source,
    };
    loop {
        let at = sc.offset();
        match sc.peek().map_err(io)? {
            None => return Ok(Cut::BetweenEvents),
            Some(b']') if *read == 0 => {
                sc.bump();
                return Ok(Cut::Closed);
            }
            Some(_) => {}
        }
        let Some(text) = sc.value().map_err(io)? else {
            return Ok(Cut::InsideEvent);
        };
        sink(text, *read, at)?;
        *read += 1;
        let at = sc.offset();
        match sc.peek().map_err(io)? {
            Some(b',') => sc.bump(),
            Some(b']') => {
                sc.bump();
                return Ok(Cut::Closed);
            }
            None => return Ok(Cut::BetweenEvents),
            Some(_) => {
                return Err(syntax(
                    file,
                    at,
                    format!("expected `,` or `]` after event {}", *read - 1),
                ))
            }
        }
    }
}

/// An event's text: checked to be UTF-8 (for a whole chunk of events at once: serde_json then
/// borrows its strings without checking each, which took a tenth of an import), or bytes whose
/// parse names what is wrong with them.
#[derive(Clone, Copy)]
enum Text<'t> {
    Utf8(&'t str),
    Bytes(&'t [u8]),
}

/// Parses one event's text into `ev` (its index and byte offset name it in the error).
fn parse_event(
    text: Text,
    keep: &[String],
    ev: &mut Event,
    file: &str,
    index: u64,
    offset: u64,
) -> Result<(), TraceError> {
    fn parse<'de, R: serde_json::de::Read<'de>>(
        mut de: serde_json::Deserializer<R>,
        keep: &[String],
        ev: &mut Event,
    ) -> Result<(), serde_json::Error> {
        EventSeed { keep, ev }.deserialize(&mut de)?;
        de.end()
    }
    match text {
        Text::Utf8(s) => parse(serde_json::Deserializer::from_str(s), keep, ev),
        Text::Bytes(b) => parse(serde_json::Deserializer::from_slice(b), keep, ev),
    }
    .map_err(|source| TraceError::BadJson {
        file: file.to_string(),
        index,
        offset,
        source,
    })
}

/// Events parsed on other threads: the text is cut into chunks of whole events here, parsed
/// by `parsers` threads, and fed into the state in the file's order on one more thread.
/// Channels are bounded, so memory is a few chunks whatever the trace's size.
fn read_parallel<R: Read>(
    sc: &mut Scanner<R>,
    state: &mut State,
    parsers: usize,
) -> Result<Top, TraceError> {
    use std::sync::{mpsc, Arc, Mutex};
    let file = state.file.clone();
    let keep = state.opts.arg_keys.clone();
    let (chunk_tx, chunk_rx) = mpsc::sync_channel::<Chunk>(parsers);
    let chunk_rx = Arc::new(Mutex::new(chunk_rx));
    let (batch_tx, batch_rx) = mpsc::sync_channel::<Batch>(parsers);
    let (free_tx, free_rx) = mpsc::channel::<Chunk>();
    let (spare_tx, spare_rx) = mpsc::channel::<Vec<Event>>();
    let spare_rx = Arc::new(Mutex::new(spare_rx));
    std::thread::scope(|scope| {
        for _ in 0..parsers {
            let (chunk_rx, spare_rx) = (chunk_rx.clone(), spare_rx.clone());
            let (batch_tx, free_tx) = (batch_tx.clone(), free_tx.clone());
            let (keep, file) = (&keep, &file);
            scope.spawn(move || loop {
                let next = match chunk_rx.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => return,
                };
                let Ok(chunk) = next else { return };
                let mut events = spare_rx
                    .lock()
                    .ok()
                    .and_then(|rx| rx.try_recv().ok())
                    .unwrap_or_default();
                let mut error = None;
                let mut parsed = 0;
                let utf8 = std::str::from_utf8(&chunk.text).ok();
                for (i, (span, &at)) in chunk.spans.iter().zip(&chunk.at).enumerate() {
                    if events.len() <= i {
                        events.push(Event::default());
                    }
                    let range = span.0 as usize..span.1 as usize;
                    let text = match utf8.and_then(|s| s.get(range.clone())) {
                        Some(s) => Text::Utf8(s),
                        None => Text::Bytes(&chunk.text[range]),
                    };
                    let index = chunk.first + i as u64;
                    if let Err(e) = parse_event(text, keep, &mut events[i], file, index, at) {
                        error = Some(e);
                        break;
                    }
                    parsed = i + 1;
                }
                let seq = chunk.seq;
                let _ = free_tx.send(chunk);
                let batch = Batch {
                    seq,
                    events,
                    parsed,
                    error,
                };
                if batch_tx.send(batch).is_err() {
                    return;
                }
            });
        }
        drop((chunk_rx, batch_tx, free_tx, spare_rx));
        let consumer = scope.spawn(move || -> Result<(), TraceError> {
            let mut next = 0;
            let mut waiting = std::collections::BTreeMap::new();
            for batch in batch_rx {
                waiting.insert(batch.seq, batch);
                while let Some(mut b) = waiting.remove(&next) {
                    for ev in &mut b.events[..b.parsed] {
                        state.take(ev)?;
                    }
                    if let Some(e) = b.error {
                        return Err(e);
                    }
                    next += 1;
                    let _ = spare_tx.send(b.events);
                }
            }
            Ok(())
        });
        let mut chunk = Chunk::default();
        let mut seq = 0;
        let hung_up = || TraceError::Io {
            file: file.clone(),
            source: std::io::Error::other("the reading threads stopped"),
        };
        let mut send = |chunk: &mut Chunk| -> Result<(), TraceError> {
            let mut full = free_rx.try_recv().unwrap_or_default();
            full.clear();
            std::mem::swap(&mut full, chunk);
            full.seq = seq;
            seq += 1;
            chunk_tx.send(full).map_err(|_| hung_up())
        };
        let mut sink = |text: &[u8], index: u64, at: u64| -> Result<(), TraceError> {
            if chunk.spans.is_empty() {
                chunk.first = index;
            }
            let start = chunk.text.len() as u32;
            chunk.text.extend_from_slice(text);
            chunk.spans.push((start, chunk.text.len() as u32));
            chunk.at.push(at);
            if chunk.text.len() >= CHUNK_BYTES || chunk.spans.len() >= CHUNK_EVENTS {
                send(&mut chunk)?;
            }
            Ok(())
        };
        let mut top = read_top(sc, &file, &mut sink);
        if top.is_ok() && !chunk.spans.is_empty() {
            if let Err(e) = send(&mut chunk) {
                top = Err(e);
            }
        }
        drop(chunk_tx);
        let fed = consumer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        // an error of the events' (in the file's order, before the reader's) first; the
        // reader's hang-up only follows one
        fed?;
        top
    })
}

/// A chunk's bytes and events: at most about this many (small in this crate's unit tests, so
/// that their traces span several chunks and threads).
const CHUNK_BYTES: usize = 1 << 17;
const CHUNK_EVENTS: usize = if cfg!(test) { 3 } else { 1024 };

/// Whole events' texts, back to back, for a parser thread.
#[derive(Default)]
struct Chunk {
    seq: u64,
    text: Vec<u8>,
    /// Each event's range in `text`.
    spans: Vec<(u32, u32)>,
    /// Each event's byte offset in the trace.
    at: Vec<u64>,
    /// The index of the first event.
    first: u64,
}

impl Chunk {
    fn clear(&mut self) {
        self.text.clear();
        self.spans.clear();
        self.at.clear();
    }
}

/// A chunk's events, parsed (the first `parsed`; then the error, if one stopped it).
struct Batch {
    seq: u64,
    events: Vec<Event>,
    parsed: usize,
    error: Option<TraceError>,
}

/// Threads that parse events, beside the one reading the text and the one feeding the state:
/// none on one CPU, else one per CPU up to 3.
fn parser_threads() -> usize {
    match std::thread::available_parallelism().map_or(1, |n| n.get()) {
        1 => 0,
        n => n.min(3),
    }
}

/// Reads a Chrome trace from `reader` (`file` names it in errors), streamed.
pub fn read_chrome<R: Read>(
    reader: R,
    file: &str,
    opts: &TraceOptions,
) -> Result<TraceSummary, TraceError> {
    read(reader, file, opts, false, parser_threads())
}

/// Reads a Chrome trace whose events of a thread are not in the order they start (Kineto writes
/// a thread's CPU ops, then its Python calls, each in order): the events are sorted by start
/// (the longer first at one instant, so a parent comes before its child; the file's order
/// otherwise), then read as [`read_chrome`] reads. Up to [`SORT_RUN_EVENTS`] they are sorted in
/// memory; past that, in runs of that many written to a temporary file and merged (an external
/// merge sort), so memory stays bounded by one run, not by the events. The summary carries a
/// note saying which.
pub fn read_chrome_sorted<R: Read>(
    reader: R,
    file: &str,
    opts: &TraceOptions,
) -> Result<TraceSummary, TraceError> {
    read(reader, file, opts, true, parser_threads())
}

fn read<R: Read>(
    reader: R,
    file: &str,
    opts: &TraceOptions,
    sort: bool,
    parsers: usize,
) -> Result<TraceSummary, TraceError> {
    let mut state = State {
        file: file.to_string(),
        opts,
        strings: HashMap::from_iter([(String::new(), 0)]),
        string_list: vec![String::new()],
        is_context: Vec::new(),
        paths: vec![(0, 0)],
        path_ids: HashMap::default(),
        key_within: Vec::new(),
        key_ids: HashMap::default(),
        key_name: Vec::new(),
        keys: Vec::new(),
        name_counts: Vec::new(),
        thread_ids: HashMap::default(),
        threads: Vec::new(),
        tid_names: Vec::new(),
        last_thread: None,
        steps: Vec::new(),
        first_unfinished: 0,
        retained: 0,
        pending: Vec::new(),
        late: 0,
        events: 0,
        spans: 0,
        skipped: 0,
        outside: 0,
        unclosed: 0,
        by_correlation: Links::default(),
        by_external: Links::default(),
        streams: HashMap::default(),
        devices: HashMap::default(),
        last_stream: None,
        pending_device: Vec::new(),
        pending_at: HashMap::default(),
        device: DeviceTotals::default(),
        any_device: false,
        clipped: 0,
        buffer: sort.then(|| sort::Sorter::new(file)),
    };
    let mut sc = Scanner::new(reader);
    let top = match parsers {
        0 => {
            let keep = opts.arg_keys.clone();
            let mut ev = Event::default();
            let st = &mut state;
            read_top(&mut sc, file, &mut |text, index, at| {
                let text = match std::str::from_utf8(text) {
                    Ok(s) => Text::Utf8(s),
                    Err(_) => Text::Bytes(text),
                };
                parse_event(text, &keep, &mut ev, file, index, at)?;
                st.take(&mut ev)
            })?
        }
        n => read_parallel(&mut sc, &mut state, n)?,
    };
    let unit = top.unit;
    let mut notes = Vec::new();
    match top.cut {
        None => {
            return Err(TraceError::NotATrace {
                file: file.to_string(),
            })
        }
        Some(Cut::Closed) => {}
        Some(Cut::InsideEvent) => {
            return Err(TraceError::CutInsideEvent {
                file: file.to_string(),
                index: top.read,
                events: top.read,
            })
        }
        Some(Cut::BetweenEvents) => notes.push(format!(
            "{file}: the event array stops after {} whole events without its closing `]` (the \
             file of a process stopped while tracing): read up to there{}",
            top.read,
            if unit.is_none() {
                "; no `displayTimeUnit` was read before the cut: timestamps taken as µs"
            } else {
                ""
            }
        )),
    }
    let (scale, name) = match unit.as_deref() {
        Some("ns") => (1e-3, "ns"),
        _ => (1.0, "us"),
    };
    if let Some(sorter) = state.buffer.take() {
        // by start, the longer first at one instant, the file's order otherwise
        state.events = 0;
        let sorted = sorter.finish(&mut state)?;
        notes.push(sorted.note(file));
    }
    let clipped = state.clipped;
    let mut summary = state.into_summary(scale, name)?;
    if clipped > 0 {
        notes.push(format!(
            "{file}: {clipped} spans crossed a step's boundary (the Python frames of the \
             profiler's own calls that open and close its step annotation): clipped at it"
        ));
    }
    summary.notes = notes;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(step: &str) -> TraceOptions {
        TraceOptions {
            step: Regex::new(step).unwrap(),
            arg_keys: vec![],
            context: None,
        }
    }

    fn read(text: &str, step: &str) -> Result<TraceSummary, TraceError> {
        read_chrome(text.as_bytes(), "t.json", &opts(step))
    }

    fn self_of(s: &TraceSummary, step: usize, name: &str) -> f64 {
        s.keys
            .iter()
            .enumerate()
            .filter(|(_, k)| k.name == name)
            .map(|(i, _)| s.steps[step].self_us[i])
            .sum()
    }

    #[test]
    fn nested_x_spans_have_self_time_less_direct_children() {
        // forward 0..100 > layer 10..60 > matmul 20..50; layer 60..90 > matmul 70..80
        let t = r#"{"traceEvents":[
          {"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1},
          {"ph":"X","name":"layer","ts":10,"dur":50,"pid":1,"tid":1},
          {"ph":"X","name":"matmul","ts":20,"dur":30,"pid":1,"tid":1},
          {"ph":"X","name":"layer","ts":60,"dur":30,"pid":1,"tid":1},
          {"ph":"X","name":"matmul","ts":70,"dur":10,"pid":1,"tid":1}
        ]}"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(s.steps.len(), 1);
        assert_eq!(s.steps[0].wall_us, 100.0);
        assert_eq!(self_of(&s, 0, "forward"), 20.0);
        assert_eq!(self_of(&s, 0, "layer"), 40.0);
        assert_eq!(self_of(&s, 0, "matmul"), 40.0);
        assert_eq!(s.spans, 5);
        assert_eq!(s.time_unit, "us");
    }

    #[test]
    fn b_e_pairs_and_x_mix_and_the_top_level_array() {
        let t = r#"[
          {"ph":"B","name":"forward","ts":0,"pid":1,"tid":1},
          {"ph":"B","name":"attn","ts":5,"pid":1,"tid":1},
          {"ph":"X","name":"softmax","ts":6,"dur":2,"pid":1,"tid":1},
          {"ph":"E","ts":15,"pid":1,"tid":1},
          {"ph":"E","name":"forward","ts":20,"pid":1,"tid":1},
          {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"main"}}
        ]"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(s.steps[0].wall_us, 20.0);
        assert_eq!(self_of(&s, 0, "forward"), 10.0);
        assert_eq!(self_of(&s, 0, "attn"), 8.0);
        assert_eq!(self_of(&s, 0, "softmax"), 2.0);
        assert_eq!(s.skipped_events, 1);
    }

    #[test]
    fn nanoseconds_by_display_time_unit_even_after_the_events() {
        let t = r#"{"traceEvents":[
          {"ph":"X","name":"forward","ts":1000,"dur":4000,"pid":1,"tid":1},
          {"ph":"X","name":"op","ts":2000,"dur":1000,"pid":1,"tid":1}
        ],"displayTimeUnit":"ns"}"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(s.time_unit, "ns");
        assert_eq!(s.steps[0].wall_us, 4.0);
        assert_eq!(self_of(&s, 0, "op"), 1.0);
        assert_eq!(self_of(&s, 0, "forward"), 3.0);
    }

    #[test]
    fn a_step_spans_threads_and_steps_are_separate() {
        // the step runs on tid 1; a worker (tid 2, another pid too) runs inside its window;
        // a span of tid 2 outside every step is not counted
        let t = r#"{"traceEvents":[
          {"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1},
          {"ph":"X","name":"mm","ts":10,"dur":50,"pid":1,"tid":2},
          {"ph":"X","name":"mm_part","ts":20,"dur":20,"pid":1,"tid":2},
          {"ph":"X","name":"io","ts":150,"dur":10,"pid":1,"tid":2},
          {"ph":"X","name":"forward","ts":200,"dur":50,"pid":1,"tid":1},
          {"ph":"X","name":"mm","ts":210,"dur":5,"pid":"gpu","tid":"stream 7"}
        ]}"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(s.steps.len(), 2);
        assert_eq!(self_of(&s, 0, "mm"), 30.0);
        assert_eq!(self_of(&s, 0, "mm_part"), 20.0);
        // the step's thread waits 10..60 for the worker: that interval is the worker's
        assert_eq!(self_of(&s, 0, "forward"), 50.0);
        assert_eq!(self_of(&s, 1, "mm"), 5.0);
        assert_eq!(self_of(&s, 1, "forward"), 45.0);
        assert_eq!(s.steps[0].concurrency(), 1.0);
        assert_eq!(s.steps[1].concurrency(), 1.0);
        assert_eq!(s.outside_steps, 1);
        assert_eq!(s.threads, 3);
    }

    /// Two workers under one span of the step's thread, hand-computed: forward 0..100 on the
    /// step's thread with attn 10..50 waiting for worker A's mm 15..45 (with a child 20..30)
    /// and worker B's mm 20..40, then norm 60..70 while worker B's late 65..80 runs.
    ///
    /// forward: its own pieces are 0..10, 50..60, 70..100 (50), less 70..80 where B ran: 40. attn: 10..50 less the
    /// workers' union 15..45: 10. norm: 60..70 less 65..70: 5. A: mm 30 - 10 = 20, child 10;
    /// B: mm 20, late 15. Sum 40 + 10 + 5 + 20 + 10 + 20 + 15 = 120 over a wall of 100.
    const TWO_WORKERS: &str = r#"[
          {"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1},
          {"ph":"X","name":"attn","ts":10,"dur":40,"pid":1,"tid":1},
          {"ph":"X","name":"mm","ts":15,"dur":30,"pid":1,"tid":2},
          {"ph":"X","name":"pack","ts":20,"dur":10,"pid":1,"tid":2},
          {"ph":"X","name":"mm","ts":20,"dur":20,"pid":1,"tid":3},
          {"ph":"X","name":"norm","ts":60,"dur":10,"pid":1,"tid":1},
          {"ph":"X","name":"late","ts":65,"dur":15,"pid":1,"tid":3}
        ]"#;

    fn check_two_workers(s: &TraceSummary) {
        assert_eq!(s.steps.len(), 1);
        assert_eq!(self_of(s, 0, "forward"), 40.0);
        assert_eq!(self_of(s, 0, "attn"), 10.0);
        assert_eq!(self_of(s, 0, "norm"), 5.0);
        assert_eq!(self_of(s, 0, "mm"), 40.0);
        assert_eq!(self_of(s, 0, "pack"), 10.0);
        assert_eq!(self_of(s, 0, "late"), 15.0);
        assert_eq!(s.steps[0].wall_us, 100.0);
        assert!((s.steps[0].concurrency() - 1.2).abs() < 1e-12);
        assert_eq!(s.late, 0);
    }

    #[test]
    fn the_step_threads_wait_for_workers_is_the_workers_time_counted_once() {
        check_two_workers(&read(TWO_WORKERS, "^forward$").unwrap());
        // the same spans as B/E pairs, the threads' events interleaved as they happened
        let t = r#"[
          {"ph":"B","name":"forward","ts":0,"pid":1,"tid":1},
          {"ph":"B","name":"attn","ts":10,"pid":1,"tid":1},
          {"ph":"B","name":"mm","ts":15,"pid":1,"tid":2},
          {"ph":"B","name":"pack","ts":20,"pid":1,"tid":2},
          {"ph":"B","name":"mm","ts":20,"pid":1,"tid":3},
          {"ph":"E","ts":30,"pid":1,"tid":2},
          {"ph":"E","ts":40,"pid":1,"tid":3},
          {"ph":"E","ts":45,"pid":1,"tid":2},
          {"ph":"E","ts":50,"pid":1,"tid":1},
          {"ph":"B","name":"norm","ts":60,"pid":1,"tid":1},
          {"ph":"B","name":"late","ts":65,"pid":1,"tid":3},
          {"ph":"E","ts":70,"pid":1,"tid":1},
          {"ph":"E","ts":80,"pid":1,"tid":3},
          {"ph":"E","ts":100,"pid":1,"tid":1}
        ]"#;
        check_two_workers(&read(t, "^forward$").unwrap());
    }

    #[test]
    fn workers_written_before_their_step_are_still_counted_once() {
        // X events written as spans close: the workers' come before the step's own
        let t = r#"[
          {"ph":"X","name":"mm","ts":15,"dur":30,"pid":1,"tid":2},
          {"ph":"X","name":"pack","ts":20,"dur":10,"pid":1,"tid":2},
          {"ph":"X","name":"mm","ts":20,"dur":20,"pid":1,"tid":3},
          {"ph":"X","name":"late","ts":65,"dur":15,"pid":1,"tid":3},
          {"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1},
          {"ph":"X","name":"attn","ts":10,"dur":40,"pid":1,"tid":1},
          {"ph":"X","name":"norm","ts":60,"dur":10,"pid":1,"tid":1}
        ]"#;
        check_two_workers(&read(t, "^forward$").unwrap());
    }

    #[test]
    fn a_worker_span_read_after_its_step_was_finished_is_counted_late() {
        // more steps than the reader keeps pieces for: the first step is finished before a
        // worker's span inside it is read (X events of a worker written at the very end)
        let steps = RETAINED_PIECES + 10;
        let mut t = String::from("[");
        for i in 0..steps {
            t.push_str(&format!(
                r#"{{"ph":"X","name":"forward","ts":{},"dur":10,"pid":1,"tid":1}},"#,
                i * 20
            ));
        }
        t.push_str(r#"{"ph":"X","name":"mm","ts":2,"dur":5,"pid":1,"tid":2}]"#);
        let s = read(&t, "^forward$").unwrap();
        assert_eq!(s.steps.len(), steps);
        assert_eq!(s.late, 1);
        // counted, but the step's thread keeps its time under it: 10 + 5 over a wall of 10
        assert_eq!(self_of(&s, 0, "mm"), 5.0);
        assert_eq!(self_of(&s, 0, "forward"), 10.0);
        // a step still held is reduced as usual
        let last = steps - 1;
        let t = t.replace(
            r#""ts":2,"dur":5,"pid":1,"tid":2"#,
            &format!(r#""ts":{},"dur":5,"pid":1,"tid":2"#, last * 20 + 2),
        );
        let s = read(&t, "^forward$").unwrap();
        assert_eq!(s.late, 0);
        assert_eq!(self_of(&s, last, "forward"), 5.0);
    }

    /// A track without a device category (a stream a tracer writes as plain spans) is another
    /// thread: its time is taken from the step's thread where it ran. Kineto's `kernel`
    /// events are device activity instead (`device_activity_takes_nothing_from_the_host`).
    #[test]
    fn a_gpu_stream_overlapping_the_launching_thread_raises_concurrency() {
        // step 0..40 on the CPU thread: launch 0..10 (a child), then it waits in `sync`
        // 10..40; a stream runs kernel 5..35 (starts during the launch). The CPU thread's
        // time under the kernel is the kernel's: launch 0..5 (5), sync 35..40 (5), the step's
        // own time none; kernel 30. Sum 40 over a wall of 40: concurrency 1.
        let t = r#"[
          {"ph":"X","name":"forward","ts":0,"dur":40,"pid":1,"tid":1},
          {"ph":"X","name":"launch","ts":0,"dur":10,"pid":1,"tid":1},
          {"ph":"X","name":"sync","ts":10,"dur":30,"pid":1,"tid":1},
          {"ph":"X","name":"kernel","ts":5,"dur":30,"pid":"gpu","tid":"stream 7"}
        ]"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(self_of(&s, 0, "launch"), 5.0);
        assert_eq!(self_of(&s, 0, "sync"), 5.0);
        assert_eq!(self_of(&s, 0, "forward"), 0.0);
        assert_eq!(self_of(&s, 0, "kernel"), 30.0);
        assert_eq!(s.steps[0].concurrency(), 1.0);
        // two streams at once: each counted, concurrency above 1 (2 x 30 + 10 over 40)
        let t = r#"[
          {"ph":"X","name":"forward","ts":0,"dur":40,"pid":1,"tid":1},
          {"ph":"X","name":"kernel","ts":5,"dur":30,"pid":"gpu","tid":"stream 7"},
          {"ph":"X","name":"kernel","ts":5,"dur":30,"pid":"gpu","tid":"stream 8"}
        ]"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(self_of(&s, 0, "forward"), 10.0);
        assert_eq!(self_of(&s, 0, "kernel"), 60.0);
        assert_eq!(s.steps[0].concurrency(), 70.0 / 40.0);
    }

    #[test]
    fn profiler_frames_crossing_a_step_are_clipped_at_its_boundary() {
        // what torch.profiler writes around ProfilerStep#N with Python stacks: the frame that
        // opens the annotation (enter 1..12) holds the step's start (10) and ends inside it;
        // the frame that closes it (step 95..105) and its child (exit 96..102) start inside
        // it and end after it (100). enter ends at 10 (self 9, outside the step), step and
        // exit end at 100: exit 96..100 = 4, step 5 - 4 = 1; the step 90 - op 30 - step 5 =
        // 55; in the step 55 + 30 + 1 + 4 = 90 = its wall
        let t = r#"[
          {"ph":"X","name":"main","ts":0,"dur":200,"pid":1,"tid":1},
          {"ph":"X","name":"enter","ts":1,"dur":11,"pid":1,"tid":1},
          {"ph":"X","name":"ProfilerStep#0","ts":10,"dur":90,"pid":1,"tid":1},
          {"ph":"X","name":"op","ts":20,"dur":30,"pid":1,"tid":1},
          {"ph":"X","name":"step","ts":95,"dur":10,"pid":1,"tid":1},
          {"ph":"X","name":"exit","ts":96,"dur":6,"pid":1,"tid":1}
        ]"#;
        let s = read(t, DEFAULT_STEP_PATTERN).unwrap();
        assert_eq!(s.steps.len(), 1);
        assert_eq!(s.steps[0].wall_us, 90.0);
        assert_eq!(self_of(&s, 0, "ProfilerStep#0"), 55.0);
        assert_eq!(self_of(&s, 0, "op"), 30.0);
        assert_eq!(self_of(&s, 0, "step"), 1.0);
        assert_eq!(self_of(&s, 0, "exit"), 4.0);
        assert_eq!(self_of(&s, 0, "enter"), 0.0);
        assert_eq!(s.steps[0].concurrency(), 1.0);
        assert_eq!(s.outside_steps, 2, "main and enter");
        assert_eq!(s.notes.len(), 1);
        assert!(
            s.notes[0].contains("3 spans crossed a step's boundary"),
            "{}",
            s.notes[0]
        );
        // spans crossing without a step are still refused
        let t = t.replace("ProfilerStep#0", "forward");
        assert!(matches!(
            read(&t, "^nothing$").unwrap_err(),
            TraceError::Overlap { .. }
        ));
    }

    #[test]
    fn a_thread_written_in_two_sorted_runs_is_read_sorted_with_a_note() {
        // Kineto's order: a thread's CPU ops, then its Python calls, each run in start order
        let t = r#"{"traceEvents":[
          {"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","ts":0,"dur":100,"pid":1,"tid":1},
          {"ph":"X","cat":"cpu_op","name":"aten::linear","ts":20,"dur":30,"pid":1,"tid":1},
          {"ph":"X","cat":"cpu_op","name":"aten::mm","ts":20,"dur":25,"pid":1,"tid":1},
          {"ph":"X","cat":"python_function","name":"nn.Module: Linear_0","ts":10,"dur":50,"pid":1,"tid":1},
          {"ph":"X","cat":"python_function","name":"torch/nn/modules/linear.py(125): forward","ts":15,"dur":40,"pid":1,"tid":1}
        ]}"#;
        let mut o = opts(DEFAULT_STEP_PATTERN);
        o.context = Some(Regex::new("^(nn\\.Module: |cpu_op$)").unwrap());
        let e = read_chrome(t.as_bytes(), "t.json", &o).unwrap_err();
        assert!(matches!(e, TraceError::OutOfOrder { .. }), "{e}");
        let s = read_chrome_sorted(t.as_bytes(), "t.json", &o).unwrap();
        // Linear_0 50 - forward 40 = 10; forward 40 - aten::linear 30 = 10; aten::linear
        // 30 - 25 = 5; aten::mm 25; the step 100 - 50 = 50
        assert_eq!(self_of(&s, 0, "nn.Module: Linear_0"), 10.0);
        assert_eq!(
            self_of(&s, 0, "torch/nn/modules/linear.py(125): forward"),
            10.0
        );
        assert_eq!(self_of(&s, 0, "aten::linear"), 5.0);
        assert_eq!(self_of(&s, 0, "aten::mm"), 25.0);
        assert_eq!(self_of(&s, 0, "ProfilerStep#1"), 50.0);
        let mm = s.keys.iter().find(|k| k.name == "aten::mm").unwrap();
        assert_eq!(mm.within, ["nn.Module: Linear_0", "aten::linear"]);
        assert_eq!(mm.parent, "aten::linear");
        assert_eq!(s.events, 5);
        assert!(
            s.notes[0]
                .contains("the 5 events (at most 64 are held) were held in memory and sorted"),
            "{:?}",
            s.notes
        );
    }

    /// Ten steps of Kineto's order, as (ts, dur, event text) in file order: three metadata
    /// events, then the CPU thread's `cpu_op`s and runtime calls (with each step's annotation)
    /// of all steps in start order, then its Python calls in start order, then the kernels.
    /// Per step at `b` = 1000 x step: ProfilerStep 0..900 > forward 10..810 > four layers at
    /// `l` = b + 20 + 150 i: Linear (python) l..l+140 > aten::linear l..l+120 = aten::matmul
    /// l..l+120 (the same extent: the first in the file is the parent) > aten::mm l..l+100 >
    /// launch l+50..l+60, whose kernel runs l+55..l+85 on device 0.
    fn kineto_ordered() -> Vec<(f64, f64, String)> {
        let x = |cat: &str, name: &str, ts: f64, dur: f64, pid: u32, args: &str| {
            (
                ts,
                dur,
                format!(
                    r#"{{"ph":"X","cat":"{cat}","name":"{name}","ts":{ts},"dur":{dur},"pid":{pid},"tid":{pid}{args}}}"#
                ),
            )
        };
        let meta = |name: &str, pid: u32| {
            (
                f64::NEG_INFINITY,
                0.0,
                format!(
                    r#"{{"ph":"M","name":"{name}","pid":{pid},"tid":0,"args":{{"name":"x"}}}}"#
                ),
            )
        };
        let mut cpu = Vec::new();
        let mut python = Vec::new();
        let mut kernels = Vec::new();
        for step in 0..10 {
            let b = 1000.0 * step as f64;
            cpu.push(x(
                "user_annotation",
                &format!("ProfilerStep#{step}"),
                b,
                900.0,
                1,
                "",
            ));
            python.push(x("python_function", "forward", b + 10.0, 800.0, 1, ""));
            for i in 0..4 {
                let l = b + 20.0 + 150.0 * i as f64;
                let c = format!(r#","args":{{"correlation":{}}}"#, step * 4 + i);
                python.push(x("python_function", "nn.Module: Linear", l, 140.0, 1, ""));
                cpu.push(x("cpu_op", "aten::linear", l, 120.0, 1, ""));
                cpu.push(x("cpu_op", "aten::matmul", l, 120.0, 1, ""));
                cpu.push(x("cpu_op", "aten::mm", l, 100.0, 1, ""));
                cpu.push(x("cuda_runtime", "cudaLaunchKernel", l + 50.0, 10.0, 1, &c));
                kernels.push(x("kernel", "gemm", l + 55.0, 30.0, 0, &c));
            }
        }
        let mut events = vec![
            meta("process_name", 1),
            meta("thread_name", 1),
            meta("process_name", 0),
        ];
        events.extend(cpu);
        events.extend(python);
        events.extend(kernels);
        events
    }

    fn trace_of(events: &[(f64, f64, String)]) -> String {
        let texts: Vec<&str> = events.iter().map(|e| e.2.as_str()).collect();
        format!(r#"{{"traceEvents":[{}]}}"#, texts.join(",\n"))
    }

    #[test]
    fn a_trace_sorted_in_runs_on_disk_reads_as_the_same_events_in_start_order() {
        let events = kineto_ordered();
        assert_eq!(events.len(), 3 + 10 * (17 + 5 + 4));
        // two events of one start and duration lie on both sides of a run's end (indices 63
        // and 64, 127 and 128: aten::linear and aten::matmul), so the merge must keep the
        // file's order across runs
        for at in [63, 127] {
            assert!(events[at].2.contains("aten::linear"), "{}", events[at].2);
            assert!(events[at + 1].2.contains("aten::matmul"));
            assert_eq!(events[at].0, events[at + 1].0);
        }
        // the same events in start order, the longer first, the file's order otherwise
        let mut sorted = events.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let o = opts(DEFAULT_STEP_PATTERN);
        let t = trace_of(&events);
        let e = read_chrome(t.as_bytes(), "t.json", &o).unwrap_err();
        assert!(matches!(e, TraceError::OutOfOrder { .. }), "{e}");
        let mut s = read_chrome_sorted(t.as_bytes(), "t.json", &o).unwrap();
        let expected = read_chrome(trace_of(&sorted).as_bytes(), "t.json", &o).unwrap();
        assert!(expected.notes.is_empty(), "{:?}", expected.notes);
        // 263 events: 4 runs of 64 and one of 7
        assert_eq!(s.notes.len(), 1);
        assert!(
            s.notes[0].contains("the 263 events were sorted by start in 5 runs of at most 64"),
            "{:?}",
            s.notes
        );
        s.notes.clear();
        assert_eq!(s, expected);
        // and by hand, per step: the step 900 - 800; forward 800 - 4 x 140; Linear 4 x (140 -
        // 120); aten::linear 120 - 120 (aten::matmul, the second in the file, is its child);
        // aten::matmul 4 x (120 - 100); aten::mm 4 x (100 - 10); the launch 4 x 10
        assert_eq!(s.steps.len(), 10);
        for step in 0..10 {
            assert_eq!(s.steps[step].wall_us, 900.0);
            assert_eq!(self_of(&s, step, &format!("ProfilerStep#{step}")), 100.0);
            assert_eq!(self_of(&s, step, "forward"), 240.0);
            assert_eq!(self_of(&s, step, "nn.Module: Linear"), 80.0);
            assert_eq!(self_of(&s, step, "aten::linear"), 0.0);
            assert_eq!(self_of(&s, step, "aten::matmul"), 80.0);
            assert_eq!(self_of(&s, step, "aten::mm"), 360.0);
            assert_eq!(self_of(&s, step, "cudaLaunchKernel"), 40.0);
            assert_eq!(s.steps[step].kernels, 4);
            assert_eq!(s.steps[step].device_busy_us, 120.0);
            let gemm = s.keys.iter().position(|k| k.name == "gemm").unwrap();
            assert_eq!(s.steps[step].device_us[gemm], 120.0);
        }
        let matmul = s.keys.iter().find(|k| k.name == "aten::matmul").unwrap();
        assert_eq!(matmul.parent, "aten::linear");
        assert_eq!(s.keys.iter().filter(|k| k.name == "aten::mm").count(), 1);
        assert_eq!(s.events, 263);
        assert_eq!(s.device.events, 40);
    }

    #[test]
    fn a_trace_sorted_in_runs_says_how_many_and_their_bytes() {
        // 65 events out of order: one full run of 64 and one of 1
        let mut events: Vec<String> = (0..65)
            .map(|i| {
                format!(
                    r#"{{"ph":"X","name":"op","ts":{},"dur":1,"pid":1,"tid":1}}"#,
                    64 - i
                )
            })
            .collect();
        events.insert(
            0,
            r#"{"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1}"#.to_string(),
        );
        events.pop();
        let t = format!(r#"{{"traceEvents":[{}]}}"#, events.join(","));
        let s = read_chrome_sorted(t.as_bytes(), "t.json", &opts("^forward$")).unwrap();
        // each event: 4 (length) + 4 + 7 ("forward") or 2 ("op") + 4 (no category) + 1 (ph)
        // + 9 + 9 (ts, dur) + 9 + 9 (pid, tid) + 4 (no args) + 1 + 1 (no ids) + 1 (no id)
        let bytes = 4 + 4 + 2 + 4 + 1 + 9 + 9 + 9 + 9 + 4 + 1 + 1 + 1;
        assert!(
            s.notes[0].contains(&format!(
                "the 65 events were sorted by start in 2 runs of at most 64 events written to \
                 a temporary file ({} bytes",
                65 * bytes + 5
            )),
            "{:?}",
            s.notes
        );
        assert_eq!(s.steps.len(), 1);
        assert_eq!(self_of(&s, 0, "forward"), 100.0 - 64.0);
        assert_eq!(self_of(&s, 0, "op"), 64.0);
    }

    #[test]
    fn device_activity_takes_nothing_from_the_host() {
        // the same shape as Kineto writes it: the kernel is `cat: kernel`, launched by the
        // runtime call of correlation 5. The CPU thread keeps its 40 (launch 10, sync 30); the
        // kernel's 30 is device time of the step, keyed under its launch
        let t = r#"[
          {"ph":"X","name":"forward","ts":0,"dur":40,"pid":1,"tid":1},
          {"ph":"X","cat":"cuda_runtime","name":"launch","ts":0,"dur":10,"pid":1,"tid":1,"args":{"correlation":5}},
          {"ph":"X","name":"sync","ts":10,"dur":30,"pid":1,"tid":1},
          {"ph":"X","cat":"kernel","name":"kernel","ts":5,"dur":30,"pid":0,"tid":7,"args":{"correlation":5}}
        ]"#;
        let s = read(t, "^forward$").unwrap();
        assert_eq!(self_of(&s, 0, "launch"), 10.0);
        assert_eq!(self_of(&s, 0, "sync"), 30.0);
        assert_eq!(self_of(&s, 0, "forward"), 0.0);
        assert_eq!(self_of(&s, 0, "kernel"), 0.0);
        assert_eq!(s.steps[0].concurrency(), 1.0);
        let k = s.keys.iter().position(|k| k.name == "kernel").unwrap();
        assert_eq!(s.keys[k].parent, "launch");
        assert_eq!(s.steps[0].device_us[k], 30.0);
        assert_eq!(s.steps[0].device_busy_us, 30.0);
        assert_eq!(s.threads, 1, "a device stream is no host thread");
        assert_eq!((s.device.events, s.device.streams), (1, 1));
    }

    #[test]
    fn kept_arguments_read_as_their_value_written_compactly() {
        // the text a serde_json::Value of the argument writes (a string: its contents), for
        // every kind of value, with and without whitespace
        let raws = [
            "[[1, 128, 640], [640]]",
            "[[1,128,640],[640]]",
            "[ [ ] ,\n\t[ 0 ] ]",
            "[]",
            "[123456789012345678]",
            "[1234567890123456789012]",
            "[-1, 2]",
            "[1.5, 2e3]",
            "[\"float\", \"\"]",
            "\"a \\\"quoted\\\" \\u00e9 name\"",
            "{\"b\": 1, \"a\": [true, null]}",
            "12",
            "-0",
            "1e400",
            "false",
        ];
        let mut text = String::from("left over");
        for raw in raws {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(raw) else {
                // a number no f64 holds is an error either way
                assert!(arg_text(raw, &mut text).is_err(), "{raw}");
                continue;
            };
            let want = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            arg_text(raw, &mut text).unwrap();
            assert_eq!(text, want, "{raw}");
        }
    }

    #[test]
    fn link_ids_are_numbers_or_strings_holding_one() {
        for (raw, want) in [
            ("42", Some(42)),
            ("-7", Some(-7)),
            ("18446744073709551615", Some(-1)),
            ("1.9e3", Some(1900)),
            ("\" 17 \"", Some(17)),
            ("\"x\"", None),
            ("null", None),
            ("[1]", None),
            ("{\"id\": 1}", None),
            ("true", None),
        ] {
            assert_eq!(link_id(raw), want, "{raw}");
        }
    }

    #[test]
    fn an_event_that_is_not_utf8_is_an_error_naming_it() {
        // the chunk's text is not UTF-8: its events are parsed from bytes, and the one with
        // the bad byte is named, on one thread and on several
        let mut t =
            b"[{\"ph\":\"X\",\"name\":\"forward\",\"ts\":0,\"dur\":5,\"pid\":1,\"tid\":1},\n"
                .to_vec();
        t.extend_from_slice(
            b"{\"ph\":\"X\",\"name\":\"a\xffb\",\"ts\":1,\"dur\":1,\"pid\":1,\"tid\":1}]",
        );
        for parsers in [0, 2] {
            let e = super::read(
                &t[..],
                "bad.json",
                &opts(DEFAULT_STEP_PATTERN),
                false,
                parsers,
            )
            .err()
            .unwrap();
            assert!(
                matches!(
                    e,
                    TraceError::BadJson {
                        index: 1,
                        offset: 60,
                        ..
                    }
                ),
                "{parsers} parsers: {e}"
            );
        }
    }

    #[test]
    fn links_hold_what_one_map_of_the_ids_holds() {
        // ids mostly increasing, some again (a launch's External id is its op's), some older,
        // some negative; checked after every insert against one map with the same cap rule
        let mut links = Links::default();
        let mut model: std::collections::HashMap<i64, u32> = Default::default();
        let (mut newest, mut dropped) = (0i64, 0u64);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = 0i64;
        for n in 0..20 * LINK_CAP as u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = match x % 10 {
                0 => next - (x >> 8) as i64 % 40,
                1 => -((x >> 8) as i64 % 50),
                2 => next,
                _ => {
                    next += 1 + (x >> 8) as i64 % 3;
                    next
                }
            };
            links.insert(id, Launch { key: n, step: None });
            newest = newest.max(id);
            model.insert(id, n);
            if model.len() > LINK_CAP {
                let before = model.len();
                let cut = newest - (LINK_CAP / 2) as i64;
                model.retain(|&k, _| k > cut);
                dropped += (before - model.len()) as u64;
            }
            assert_eq!(links.dropped, dropped);
            for probe in [id, id - 1, id - 7, id - 100, next - 3] {
                assert_eq!(
                    links.get(probe).map(|l| l.key),
                    model.get(&probe).copied(),
                    "id {probe} after insert {n}"
                );
            }
        }
        assert!(dropped > 0, "the cap was passed");
        assert_eq!(links.sorted.len() + links.map.len(), model.len());
        assert!(!links.map.is_empty(), "some ids came out of order");
    }

    #[test]
    fn launches_past_the_cap_are_let_go_oldest_first_and_counted() {
        // LINK_CAP + 10 launches in one step, then their kernels: the oldest half is let go
        // once the cap is passed, and their kernels are counted unlinked, not dropped
        let n = LINK_CAP + 10;
        let mut t = format!(
            r#"[{{"ph":"X","name":"forward","ts":0,"dur":{},"pid":1,"tid":1}}"#,
            n * 10 + 10
        );
        for i in 0..n {
            t.push_str(&format!(
                r#",{{"ph":"X","cat":"cuda_runtime","name":"launch","ts":{},"dur":1,"pid":1,"tid":1,"args":{{"correlation":{}}}}}"#,
                i * 10 + 1,
                i + 1
            ));
        }
        for i in 0..n {
            t.push_str(&format!(
                r#",{{"ph":"X","cat":"kernel","name":"k","ts":{},"dur":2,"pid":0,"tid":7,"args":{{"correlation":{}}}}}"#,
                i * 10 + 5,
                i + 1
            ));
        }
        t.push(']');
        let s = read(&t, "^forward$").unwrap();
        // at LINK_CAP + 1 entries, those with id <= (LINK_CAP + 1) - LINK_CAP / 2 go
        let dropped = (LINK_CAP + 1 - LINK_CAP / 2) as u64;
        assert_eq!(s.device.links_dropped, dropped);
        assert_eq!(s.device.unlinked, dropped);
        assert_eq!(s.device.unlinked_us, 2.0 * dropped as f64);
        assert_eq!(s.steps[0].kernels, n as u64 - dropped);
    }

    /// A Kineto-shaped trace of `steps` steps: per step a module span, two ops with args,
    /// a runtime launch with its flow, a worker thread's span, and the kernels on two streams.
    fn kineto_like(steps: usize) -> String {
        let mut ev = Vec::new();
        for i in 0..steps {
            let t = i as f64 * 100.0;
            let c = i * 10;
            ev.push(format!(r#"{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{i}","pid":1,"tid":1,"ts":{t},"dur":90}}"#));
            ev.push(format!(r#"{{"ph":"X","cat":"python_function","name":"nn.Module: Linear_0","pid":1,"tid":1,"ts":{},"dur":50,"args":{{"Python id":{c}}}}}"#, t + 1.0));
            ev.push(format!(r#"{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":{},"dur":20,"args":{{"External id":{c},"Input Dims":[[4,{i}],[{i},8]],"Concrete Inputs":["", "a \"}}\" b"]}}}}"#, t + 2.0));
            ev.push(format!(r#"{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{},"dur":3,"args":{{"External id":{c},"correlation":{}}}}}"#, t + 5.0, c + 1));
            ev.push(format!(
                r#"{{"ph":"s","id":{},"pid":1,"tid":1,"ts":{},"cat":"ac2g","name":"ac2g"}}"#,
                c + 1,
                t + 5.0
            ));
            ev.push(format!(r#"{{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":{},"dur":10,"args":{{"External id":{}}}}}"#, t + 30.0, c + 2));
            ev.push(format!(
                r#"{{"ph":"X","cat":"cpu_op","name":"worker","pid":1,"tid":2,"ts":{},"dur":30}}"#,
                t + 55.0
            ));
        }
        for i in 0..steps {
            let t = i as f64 * 100.0;
            let c = i * 10;
            ev.push(format!(r#"{{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":{},"dur":25,"args":{{"correlation":{}}}}}"#, t + 8.0, c + 1));
            ev.push(format!(r#"{{"ph":"X","cat":"kernel","name":"nccl","pid":0,"tid":8,"ts":{},"dur":25,"args":{{"External id":{}}}}}"#, t + 20.0, c + 2));
        }
        format!(
            "{{\"traceEvents\":[\n{}\n],\"displayTimeUnit\":\"us\"}}",
            ev.join(",\n")
        )
    }

    fn read_with(text: &str, parsers: usize) -> Result<TraceSummary, TraceError> {
        super::read(
            text.as_bytes(),
            "t.json",
            &opts(DEFAULT_STEP_PATTERN),
            false,
            parsers,
        )
    }

    #[test]
    fn events_parsed_on_other_threads_give_the_summary_read_on_one() {
        // chunks of 3 events in this crate's tests: the trace spans dozens of chunks
        let t = kineto_like(12);
        let one = read_with(&t, 0).unwrap();
        assert_eq!(one.steps.len(), 12);
        assert_eq!(one.events, 12 * 9);
        assert_eq!(one.device.events, 24);
        // the two streams' kernels, 8..33 and 20..45 after each step's start: busy 37 of 50
        assert!(one.steps.iter().all(|s| s.device_busy_us == 37.0));
        for parsers in [1, 2, 3] {
            assert_eq!(
                read_with(&t, parsers).unwrap(),
                one,
                "{parsers} parser threads"
            );
        }
        // errors: the first in the file's order, the same whatever the threads; a bad event
        // in a late chunk after a spans' error in an early one, and alone
        let overlap = t.replacen(
            r#""name":"aten::add","pid":1,"tid":1,"ts":230"#,
            r#""name":"aten::add","pid":1,"tid":1,"ts":221"#,
            1,
        );
        assert_ne!(overlap, t);
        let bad = overlap.replacen(
            r#""name":"gemm","pid":0,"tid":7,"ts":908"#,
            r#""name":"gemm","pid":0,"tid":7,"ts":nope"#,
            1,
        );
        assert_ne!(bad, overlap);
        let bad_alone = t.replacen(
            r#""name":"gemm","pid":0,"tid":7,"ts":908"#,
            r#""name":"gemm","pid":0,"tid":7,"ts":nope"#,
            1,
        );
        for text in [&overlap, &bad, &bad_alone] {
            let want = read_with(text, 0).unwrap_err().to_string();
            for parsers in [1, 3] {
                assert_eq!(read_with(text, parsers).unwrap_err().to_string(), want);
            }
        }
        assert!(read_with(&bad, 2)
            .unwrap_err()
            .to_string()
            .contains("overlap"));
        let e = read_with(&bad_alone, 2).unwrap_err();
        // 12 steps of 7 host events, then two kernels a step: step 9's first is event 102
        assert!(matches!(e, TraceError::BadJson { index: 102, .. }), "{e}");
    }

    #[test]
    fn kineto_fields_category_and_input_dims() {
        let t = r#"{"schemaVersion":1,"deviceProperties":[],"traceEvents":[
          {"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","pid":7,"tid":7,"ts":1.5,"dur":100.0,"args":{"External id":1}},
          {"ph":"X","cat":"cpu_op","name":"aten::mm","pid":7,"tid":7,"ts":2.0,"dur":40.0,"args":{"External id":2,"Input Dims":[[4,8],[8,16]],"Input type":["float","float"]}},
          {"ph":"X","cat":"cpu_op","name":"aten::mm","pid":7,"tid":7,"ts":50.0,"dur":10.0,"args":{"External id":3,"Input Dims":[[4,16],[16,8]]}}
        ],"displayTimeUnit":"ms"}"#;
        let s = read(t, DEFAULT_STEP_PATTERN).unwrap();
        assert_eq!(s.time_unit, "us");
        let mm: Vec<&SpanKey> = s.keys.iter().filter(|k| k.name == "aten::mm").collect();
        assert_eq!(mm.len(), 2, "distinct input dims are distinct spans");
        assert_eq!(mm[0].cat, "cpu_op");
        assert_eq!(mm[0].arg("Input Dims"), Some("[[4,8],[8,16]]"));
        assert_eq!(self_of(&s, 0, "aten::mm"), 50.0);
        assert_eq!(self_of(&s, 0, "ProfilerStep#3"), 50.0);
    }

    #[test]
    fn a_trace_cut_inside_an_event_is_an_error_naming_the_file() {
        let t = r#"{"traceEvents":[{"ph":"X","name":"forward","ts":0,"dur":1,"pid":1,"tid":1},{"ph":"X","na"#;
        let e = read(t, "^forward$").unwrap_err();
        assert!(
            matches!(e, TraceError::CutInsideEvent { index: 1, .. }),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("t.json: the trace stops inside event 1"),
            "{e}"
        );
        // JSON broken otherwise is still refused as such
        let t = r#"[{"ph":"X","name":"forward","ts":0,"dur":1,"pid":1,"tid":1}},"#;
        let e = read(t, "^forward$").unwrap_err();
        assert!(matches!(e, TraceError::Syntax { offset: 59, .. }), "{e}");
        assert!(
            e.to_string().starts_with(
                "t.json: not valid trace JSON at byte 59: expected `,` or `]` after event 0"
            ),
            "{e}"
        );
        // an event that is not JSON inside is serde_json's error, with the event and its place
        let t =
            r#"[{"ph":"X","name":"forward","ts":0,"dur":1,"pid":1,"tid":1},{"ph":"X","ts":nope}]"#;
        let e = read(t, "^forward$").unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::BadJson {
                    index: 1,
                    offset: 60,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn an_event_array_without_its_closing_bracket_is_read_with_a_note() {
        // what a process killed while tracing leaves: whole events, then nothing (with or
        // without the comma after the last one, in the top-level array or in traceEvents)
        let events = r#"{"ph":"X","name":"forward","ts":0,"dur":10,"pid":1,"tid":1},
          {"ph":"X","name":"op","ts":2,"dur":5,"pid":1,"tid":1}"#;
        for t in [
            format!("[{events}"),
            format!("[{events},\n"),
            format!(r#"{{"traceEvents":[{events},"#),
        ] {
            let s = read(&t, "^forward$").unwrap();
            assert_eq!(s.events, 2, "{t}");
            assert_eq!(self_of(&s, 0, "op"), 5.0);
            assert_eq!(s.notes.len(), 1, "{t}");
            assert!(
                s.notes[0].starts_with("t.json: the event array stops after 2 whole events"),
                "{}",
                s.notes[0]
            );
        }
        let s = read(&format!("[{events}]"), "^forward$").unwrap();
        assert!(s.notes.is_empty());
    }

    #[test]
    fn no_step_span_names_the_pattern_and_the_names_seen() {
        let t = r#"[{"ph":"X","name":"op","ts":0,"dur":1,"pid":1,"tid":1}]"#;
        let e = read(t, "^forward$").unwrap_err().to_string();
        assert!(e.contains("no step span") && e.contains("'op' x1"), "{e}");
    }

    #[test]
    fn spans_overlapping_without_nesting_are_refused() {
        let t = r#"[{"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1},
                    {"ph":"X","name":"a","ts":10,"dur":20,"pid":1,"tid":1},
                    {"ph":"X","name":"b","ts":20,"dur":20,"pid":1,"tid":1}]"#;
        let e = read(t, "^forward$").unwrap_err();
        assert!(matches!(e, TraceError::Overlap { .. }), "{e}");
        // B/E: the E closes a span other than the innermost open one
        let t = r#"[{"ph":"B","name":"forward","ts":0,"pid":1,"tid":1},
                    {"ph":"B","name":"a","ts":1,"pid":1,"tid":1},
                    {"ph":"E","name":"forward","ts":5,"pid":1,"tid":1}]"#;
        assert!(matches!(
            read(t, "^forward$").unwrap_err(),
            TraceError::Overlap { .. }
        ));
    }

    #[test]
    fn e_without_b_is_refused() {
        let t = r#"[{"ph":"X","name":"forward","ts":0,"dur":100,"pid":1,"tid":1},
                    {"ph":"E","name":"x","ts":20,"pid":1,"tid":2}]"#;
        let e = read(t, "^forward$").unwrap_err();
        assert!(matches!(e, TraceError::EndWithoutBegin { .. }), "{e}");
    }

    #[test]
    fn out_of_order_x_events_are_refused_and_other_json_is_not_a_trace() {
        let t = r#"[{"ph":"X","name":"forward","ts":10,"dur":100,"pid":1,"tid":1},
                    {"ph":"X","name":"a","ts":50,"dur":5,"pid":1,"tid":1},
                    {"ph":"X","name":"b","ts":20,"dur":5,"pid":1,"tid":1}]"#;
        assert!(matches!(
            read(t, "^forward$").unwrap_err(),
            TraceError::OutOfOrder { .. }
        ));
        for t in [r#"{"a":1}"#, r#"3"#, r#""x""#] {
            let e = read(t, "^forward$").unwrap_err();
            assert!(matches!(e, TraceError::NotATrace { .. }), "{t}: {e}");
        }
        let e = read(r#"[{"ph":"X","name":"a","ts":0,"pid":1,"tid":1}]"#, "a").unwrap_err();
        assert!(
            e.to_string().contains("event 0: an X event without `dur`"),
            "{e}"
        );
    }

    /// The import rate on one core: run with
    /// `cargo test --release -p opledger-core trace::tests::import_rate -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn import_rate() {
        let steps = 2_000;
        let per_step = 500;
        let mut t = String::from("{\"traceEvents\":[\n");
        let mut ts = 0u64;
        for s in 0..steps {
            let start = ts;
            t.push_str(&format!(
                "{{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"forward\",\"ts\":{start},\"dur\":{},\"pid\":1,\"tid\":1}},\n",
                per_step * 10 + 5
            ));
            for i in 0..per_step {
                ts += 10;
                let name = ["qmatmul", "softmax", "rms_norm", "rope", "silu"][i % 5];
                t.push_str(&format!(
                    "{{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"{name}\",\"ts\":{ts},\"dur\":8,\"pid\":1,\"tid\":{},\"args\":{{\"layer\":{}}}}},\n",
                    1 + (i % 2),
                    i / 20
                ));
            }
            ts += 20;
            let _ = s;
        }
        t.push_str("{\"ph\":\"M\",\"name\":\"end\",\"pid\":1,\"tid\":1}]}");
        let t0 = std::time::Instant::now();
        let s = read_chrome(
            std::io::BufReader::new(t.as_bytes()),
            "bench.json",
            &opts(DEFAULT_STEP_PATTERN),
        )
        .unwrap();
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "import rate: {} events ({:.1} MB) in {:.3} s = {:.2} M events/s",
            s.events,
            t.len() as f64 / 1e6,
            secs,
            s.events as f64 / secs / 1e6
        );
        assert_eq!(s.steps.len(), steps);
    }
}
