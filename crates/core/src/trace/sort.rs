//! Events sorted by start in bounded memory, for traces whose threads' events are not in start
//! order ([`super::read_chrome_sorted`]): an external merge sort. At most [`SORT_RUN_EVENTS`]
//! events are held; a full buffer is sorted and written as a run to a temporary file (removed
//! when it is dropped), and at the end the runs are merged, a head event per run, in the order
//! one stable sort of all the events gives.
//!
//! A run's events are written in a binary form of their own (a length, then each field; floats
//! as their bits), which gives back each [`Event`] exactly: no crate of the workspace writes one
//! (serde_json would round-trip the floats, but at several times the bytes and the time).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};

use super::{Event, Id, State, TraceError};

/// The most events held at once while sorting a trace out of start order: past this many, they
/// are sorted and written to a temporary file as one run. An event held takes about 300 bytes
/// (its fields and strings), so a run takes about 10 MB. Small in this crate's unit tests, so
/// that they spill several runs.
pub const SORT_RUN_EVENTS: usize = if cfg!(test) { 64 } else { 1 << 15 };

/// The read buffers of all runs together while they are merged: each run reads its file in
/// chunks of this over the number of runs (between 4 KiB and 256 KiB).
const MERGE_READ_BYTES: usize = 4 << 20;

/// The order events are read in: by start; at one instant the longer span first (a parent
/// before its child); events without a start (metadata) first. Equal events keep the file's
/// order (the sorts are stable and the merge breaks ties by run, then by place in the run).
fn by_start(a: &Event, b: &Event) -> Ordering {
    let ka = (a.ts.unwrap_or(f64::NEG_INFINITY), -a.dur.unwrap_or(0.0));
    let kb = (b.ts.unwrap_or(f64::NEG_INFINITY), -b.dur.unwrap_or(0.0));
    ka.0.total_cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
}

/// How the events were sorted, for the summary's note.
pub(super) struct Sorted {
    pub events: u64,
    /// Runs written to the temporary file (0: sorted in memory).
    pub runs: usize,
    /// The temporary file's size.
    pub bytes: u64,
}

impl Sorted {
    pub fn note(&self, file: &str) -> String {
        let how = if self.runs == 0 {
            format!(
                "the {} events (at most {SORT_RUN_EVENTS} are held) were held in memory and \
                 sorted by start before being read",
                self.events
            )
        } else {
            format!(
                "the {} events were sorted by start in {} runs of at most {SORT_RUN_EVENTS} \
                 events written to a temporary file ({} bytes, removed after) and merged \
                 before being read: memory held one run at a time",
                self.events, self.runs, self.bytes
            )
        };
        format!(
            "{file}: the events of a thread are not in the order they start (Kineto writes a \
             thread's CPU ops, then its Python calls): {how}"
        )
    }
}

/// The runs written so far: one temporary file, each run a byte range of it.
struct Spill {
    out: BufWriter<File>,
    /// (start, end) of each run in the file.
    runs: Vec<(u64, u64)>,
    bytes: u64,
}

/// Events held to be sorted, in runs of at most [`SORT_RUN_EVENTS`].
pub(super) struct Sorter {
    file: String,
    buf: Vec<Event>,
    spill: Option<Spill>,
    events: u64,
    scratch: Vec<u8>,
}

/// An error on the temporary file, named as such, for the trace `file`.
fn temp_error(file: &str, e: io::Error) -> TraceError {
    TraceError::Io {
        file: file.to_string(),
        source: io::Error::new(
            e.kind(),
            format!("the temporary file the events are sorted in: {e}"),
        ),
    }
}

impl Sorter {
    pub fn new(file: &str) -> Sorter {
        Sorter {
            file: file.to_string(),
            buf: Vec::new(),
            spill: None,
            events: 0,
            scratch: Vec::new(),
        }
    }

    /// Holds a copy of `ev`; a full buffer is sorted and written as a run.
    pub fn push(&mut self, ev: &Event) -> Result<(), TraceError> {
        self.buf.push(ev.clone());
        self.events += 1;
        if self.buf.len() >= SORT_RUN_EVENTS {
            self.write_run().map_err(|e| temp_error(&self.file, e))?;
        }
        Ok(())
    }

    /// Sorts the buffer and writes it to the temporary file as one run; the buffer is emptied.
    fn write_run(&mut self) -> io::Result<()> {
        self.buf.sort_by(by_start);
        let spill = match &mut self.spill {
            Some(s) => s,
            None => self.spill.insert(Spill {
                out: BufWriter::with_capacity(1 << 16, tempfile::tempfile()?),
                runs: Vec::new(),
                bytes: 0,
            }),
        };
        let start = spill.bytes;
        for ev in self.buf.drain(..) {
            self.scratch.clear();
            encode(&ev, &mut self.scratch);
            let len = u32::try_from(self.scratch.len())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an event over 4 GiB"))?;
            spill.out.write_all(&len.to_le_bytes())?;
            spill.out.write_all(&self.scratch)?;
            spill.bytes += 4 + self.scratch.len() as u64;
        }
        spill.runs.push((start, spill.bytes));
        Ok(())
    }

    /// Feeds every event held or written to `state`, in start order (that of one stable sort
    /// of them all).
    pub fn finish(mut self, state: &mut State<'_>) -> Result<Sorted, TraceError> {
        if self.spill.is_none() {
            self.buf.sort_by(by_start);
            for mut ev in std::mem::take(&mut self.buf) {
                state.event(&mut ev)?;
            }
            return Ok(Sorted {
                events: self.events,
                runs: 0,
                bytes: 0,
            });
        }
        let file = self.file.clone();
        let tmp = |e| temp_error(&file, e);
        if !self.buf.is_empty() {
            self.write_run().map_err(tmp)?;
        }
        self.buf = Vec::new();
        let Some(spill) = self.spill.take() else {
            unreachable!("checked above")
        };
        let (runs, bytes) = (spill.runs, spill.bytes);
        let mut f = spill.out.into_inner().map_err(|e| tmp(e.into_error()))?;
        let chunk = (MERGE_READ_BYTES / runs.len()).clamp(4 << 10, 256 << 10);
        let mut cursors: Vec<Cursor> = runs
            .iter()
            .map(|&(start, end)| Cursor {
                next: start,
                end,
                buf: Vec::new(),
                at: 0,
                chunk,
            })
            .collect();
        let mut heap = BinaryHeap::with_capacity(cursors.len());
        for (run, c) in cursors.iter_mut().enumerate() {
            if let Some(ev) = c.next_event(&mut f).map_err(tmp)? {
                heap.push(Head { ev, run, seq: 0 });
            }
        }
        while let Some(Head { mut ev, run, seq }) = heap.pop() {
            if let Some(next) = cursors[run].next_event(&mut f).map_err(tmp)? {
                heap.push(Head {
                    ev: next,
                    run,
                    seq: seq + 1,
                });
            }
            state.event(&mut ev)?;
        }
        Ok(Sorted {
            events: self.events,
            runs: runs.len(),
            bytes,
        })
    }
}

/// A run's next event in the merge: the least by start, then by run, then by place in its run
/// (a max-heap of the reversed order).
struct Head {
    ev: Event,
    run: usize,
    seq: u64,
}

impl Ord for Head {
    fn cmp(&self, other: &Head) -> Ordering {
        by_start(&other.ev, &self.ev)
            .then(other.run.cmp(&self.run))
            .then(other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Head) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Head) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

/// Reads one run of the temporary file (shared by all runs: each read seeks to its place).
struct Cursor {
    /// The file offset of the first byte not yet read into `buf`.
    next: u64,
    end: u64,
    buf: Vec<u8>,
    at: usize,
    chunk: usize,
}

fn corrupt(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

impl Cursor {
    /// Makes at least `n` unread bytes of the run be in `buf`.
    fn ensure(&mut self, f: &mut File, n: usize) -> io::Result<()> {
        let have = self.buf.len() - self.at;
        if have >= n {
            return Ok(());
        }
        let left = self.end - self.next;
        let want = (n - have).max(self.chunk) as u64;
        let want = want.min(left) as usize;
        if have + want < n {
            return Err(corrupt("a run ends inside an event"));
        }
        self.buf.drain(..self.at);
        self.at = 0;
        self.buf.resize(have + want, 0);
        f.seek(SeekFrom::Start(self.next))?;
        f.read_exact(&mut self.buf[have..])?;
        self.next += want as u64;
        Ok(())
    }

    fn next_event(&mut self, f: &mut File) -> io::Result<Option<Event>> {
        if self.at == self.buf.len() && self.next == self.end {
            return Ok(None);
        }
        self.ensure(f, 4)?;
        let len = u32::from_le_bytes(self.buf[self.at..self.at + 4].try_into().unwrap()) as usize;
        self.at += 4;
        self.ensure(f, len)?;
        let ev = decode(&self.buf[self.at..self.at + len])?;
        self.at += len;
        Ok(Some(ev))
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_f64(out: &mut Vec<u8>, v: Option<f64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_bits().to_le_bytes());
        }
    }
}

fn put_i64(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn put_id(out: &mut Vec<u8>, v: &Option<Id>) {
    match v {
        None => out.push(0),
        Some(Id::Num(n)) => {
            out.push(1);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Some(Id::Str(s)) => {
            out.push(2);
            put_str(out, s);
        }
    }
}

/// Writes `ev` as bytes that [`decode`] reads back into an equal event.
fn encode(ev: &Event, out: &mut Vec<u8>) {
    put_str(out, &ev.name);
    put_str(out, &ev.cat);
    out.push(ev.ph);
    put_f64(out, ev.ts);
    put_f64(out, ev.dur);
    put_id(out, &ev.pid);
    put_id(out, &ev.tid);
    out.extend_from_slice(&(ev.args.len() as u32).to_le_bytes());
    for (k, v) in &ev.args {
        put_str(out, k);
        put_str(out, v);
    }
    put_i64(out, ev.correlation);
    put_i64(out, ev.external_id);
    put_id(out, &ev.id);
}

/// Reads the fields of one encoded event in turn.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(corrupt("an event ends early"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn str(&mut self) -> io::Result<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| corrupt("a string is not UTF-8"))
    }

    fn tag(&mut self, max: u8) -> io::Result<u8> {
        let t = self.u8()?;
        if t > max {
            return Err(corrupt("an unknown tag"));
        }
        Ok(t)
    }

    fn f64(&mut self) -> io::Result<Option<f64>> {
        Ok(match self.tag(1)? {
            0 => None,
            _ => Some(f64::from_bits(self.u64()?)),
        })
    }

    fn i64(&mut self) -> io::Result<Option<i64>> {
        Ok(match self.tag(1)? {
            0 => None,
            _ => Some(self.u64()? as i64),
        })
    }

    fn id(&mut self) -> io::Result<Option<Id>> {
        Ok(match self.tag(2)? {
            0 => None,
            1 => Some(Id::Num(self.u64()? as i64)),
            _ => Some(Id::Str(self.str()?)),
        })
    }
}

/// Reads back an event [`encode`] wrote.
fn decode(bytes: &[u8]) -> io::Result<Event> {
    let mut f = Fields(bytes);
    let name = f.str()?;
    let cat = f.str()?;
    let ph = f.u8()?;
    let ts = f.f64()?;
    let dur = f.f64()?;
    let pid = f.id()?;
    let tid = f.id()?;
    let n = f.u32()? as usize;
    // each pair takes at least 8 bytes: a count beyond that is a corrupt file, not an allocation
    let mut args = Vec::with_capacity(n.min(f.0.len() / 8));
    for _ in 0..n {
        let k = f.str()?;
        let v = f.str()?;
        args.push((k, v));
    }
    let correlation = f.i64()?;
    let external_id = f.i64()?;
    let id = f.id()?;
    if !f.0.is_empty() {
        return Err(corrupt("an event has bytes past its end"));
    }
    Ok(Event {
        name,
        cat,
        ph,
        ts,
        dur,
        pid,
        tid,
        args,
        spare_args: Vec::new(),
        correlation,
        external_id,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &Event, b: &Event) -> bool {
        a.name == b.name
            && a.cat == b.cat
            && a.ph == b.ph
            && a.ts.map(f64::to_bits) == b.ts.map(f64::to_bits)
            && a.dur.map(f64::to_bits) == b.dur.map(f64::to_bits)
            && a.pid == b.pid
            && a.tid == b.tid
            && a.args == b.args
            && a.correlation == b.correlation
            && a.external_id == b.external_id
            && a.id == b.id
    }

    #[test]
    fn an_event_is_read_back_exactly() {
        let full = Event {
            name: "aten::mm ü".into(),
            cat: "cpu_op".into(),
            ph: b'X',
            ts: Some(1.000_000_000_000_000_2e15),
            dur: Some(-0.0),
            pid: Some(Id::Num(-7)),
            tid: Some(Id::Str("stream 7".into())),
            args: vec![
                ("Input Dims".into(), "[[1, 2]]".into()),
                ("".into(), "".into()),
            ],
            spare_args: Vec::new(),
            correlation: Some(i64::MIN),
            external_id: Some(i64::MAX),
            id: Some(Id::Str("".into())),
        };
        for ev in [full, Event::default()] {
            let mut b = Vec::new();
            encode(&ev, &mut b);
            assert!(same(&decode(&b).unwrap(), &ev));
            // cut anywhere, or with a byte too many, it is refused
            for cut in 0..b.len() {
                assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
            }
            b.push(0);
            assert!(decode(&b).is_err());
        }
    }

    #[test]
    fn a_run_cut_short_is_an_io_error_naming_the_trace_and_the_temporary_file() {
        let mut b = Vec::new();
        encode(&Event::default(), &mut b);
        let mut f = tempfile::tempfile().unwrap();
        // a whole event, then the length of another and half of it
        for part in [&b[..], &b[..b.len() / 2]] {
            f.write_all(&(b.len() as u32).to_le_bytes()).unwrap();
            f.write_all(part).unwrap();
        }
        let end = f.stream_position().unwrap();
        let mut c = Cursor {
            next: 0,
            end,
            buf: Vec::new(),
            at: 0,
            chunk: 4 << 10,
        };
        assert!(same(
            &c.next_event(&mut f).unwrap().unwrap(),
            &Event::default()
        ));
        let Err(e) = c.next_event(&mut f) else {
            panic!("a run cut inside an event was read")
        };
        let msg = temp_error("t.json", e).to_string();
        assert!(
            msg.starts_with(
                "t.json: the temporary file the events are sorted in: a run ends inside an event"
            ),
            "{msg}"
        );
    }
}
