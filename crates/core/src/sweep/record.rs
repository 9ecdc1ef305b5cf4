//! A sweep's measurements as they land: one binary record per measured unit (a prefill chunk, or
//! the decode steps after it) of one mode and cycle, the pass logs, and the stores that keep them
//! (a run folder, or memory for tests), so an interrupted sweep resumes where it stopped.

use serde::{Deserialize, Serialize};

use super::SweepError;
use crate::engine::Mode;

/// What a record measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The prefill chunk `chunk`, decoded at depth `chunk x chunk_tokens`.
    Prefill,
    /// The decode steps after chunk `chunk`, at depth `(chunk + 1) x chunk_tokens`.
    Decode,
}

impl Phase {
    fn code(self) -> u32 {
        match self {
            Phase::Prefill => 0,
            Phase::Decode => 1,
        }
    }
}

/// One measured unit of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkRecord {
    pub cycle: u32,
    /// `Fused` or `Timed`.
    pub mode: Mode,
    pub chunk: u32,
    pub phase: Phase,
    pub wall_ms: f64,
    /// A hash of the logits the unit computed (0: not recorded, a version-1 file): FUSED and
    /// TIMED of the same unit start from the same state and must compute the same.
    pub output_hash: u64,
    /// The engine's isolation cost, µs per node per step, measured right after a TIMED decode
    /// unit (0 where not measured).
    pub isolation_us: f64,
    /// The same node by node, in graph order, where the engine calibrates each node (what
    /// isolating a node costs depends on what was computed before it); empty otherwise.
    pub isolation_node_us: Vec<f32>,
    /// Per-node µs of a TIMED unit, in graph order (decode: summed over the steps); empty for
    /// FUSED.
    pub node_us: Vec<f32>,
    /// The second unit of a FUSED/TIMED pair whose output hash differed from the first's: the
    /// largest NMSE of its logits (decode steps: the last step's) against FUSED's, row by row
    /// ([`crate::outputs::compare_rows`], NaN where a row was not finite); `None` where not
    /// compared (the hashes agreed, the engine did not expose its logits, or the unit is the
    /// first of its pair).
    pub outputs_nmse: Option<f64>,
}

const RECORD_MAGIC: &[u8; 4] = b"OPLC";
/// Version 2 adds the phase, the output hash and the isolation cost; version 3 the isolation
/// cost node by node; version 4 the NMSE of a pair's differing logits.
const RECORD_VERSION: u32 = 4;
const V1_HEADER_BYTES: usize = 4 + 4 + 4 + 4 + 4 + 4 + 8;
const V2_HEADER_BYTES: usize = 4 + 4 * 6 + 8 + 8 + 8;
const V3_HEADER_BYTES: usize = V2_HEADER_BYTES + 4;
pub(super) const RECORD_HEADER_BYTES: usize = V3_HEADER_BYTES + 8;

fn mode_code(mode: Mode) -> u32 {
    match mode {
        Mode::Fused => 0,
        Mode::FusedObserved => 1,
        Mode::Timed => 2,
    }
}

pub(super) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Fused => "fused",
        Mode::FusedObserved => "observed",
        Mode::Timed => "timed",
    }
}

impl ChunkRecord {
    /// The file a record is stored in: `c000-timed-00012.bin` for a prefill chunk,
    /// `c000-timed-00012-decode.bin` for the decode steps after it.
    pub fn file_name(cycle: u32, mode: Mode, chunk: u32, phase: Phase) -> String {
        match phase {
            Phase::Prefill => format!("c{cycle:03}-{}-{chunk:05}.bin", mode_name(mode)),
            Phase::Decode => format!("c{cycle:03}-{}-{chunk:05}-decode.bin", mode_name(mode)),
        }
    }

    /// Little-endian binary: magic, version, cycle, mode, chunk, phase, node count, wall (f64),
    /// output hash (u64), isolation cost (f64), the count of per-node isolation costs (u32: 0 or
    /// the node count), the outputs' NMSE (f64, infinite: not compared), then one f32 of µs per node
    /// and one f32 of isolation per node. About 4 bytes a node.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            RECORD_HEADER_BYTES + 4 * (self.node_us.len() + self.isolation_node_us.len()),
        );
        out.extend_from_slice(RECORD_MAGIC);
        for v in [
            RECORD_VERSION,
            self.cycle,
            mode_code(self.mode),
            self.chunk,
            self.phase.code(),
            self.node_us.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.wall_ms.to_le_bytes());
        out.extend_from_slice(&self.output_hash.to_le_bytes());
        out.extend_from_slice(&self.isolation_us.to_le_bytes());
        out.extend_from_slice(&(self.isolation_node_us.len() as u32).to_le_bytes());
        // None as an infinity: NaN is a compared row that was not finite
        out.extend_from_slice(&self.outputs_nmse.unwrap_or(f64::INFINITY).to_le_bytes());
        for v in self.node_us.iter().chain(&self.isolation_node_us) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes a record (version 1 to 4); `what` names it in errors (a file path).
    pub fn decode(bytes: &[u8], what: &str) -> Result<ChunkRecord, SweepError> {
        let bad = |why: String| SweepError::BadRecord {
            what: what.to_string(),
            why,
        };
        if bytes.len() < V1_HEADER_BYTES || &bytes[..4] != RECORD_MAGIC {
            return Err(bad("not a chunk record".into()));
        }
        let u = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let f = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i..i + 8]);
            b
        };
        let version = u(4);
        let mode = match u(12) {
            0 => Mode::Fused,
            1 => Mode::FusedObserved,
            2 => Mode::Timed,
            m => return Err(bad(format!("unknown mode {m}"))),
        };
        let (phase, n, header, wall_ms, output_hash, isolation_us, iso_n, outputs_nmse) =
            match version {
                1 => (
                    Phase::Prefill,
                    u(20) as usize,
                    V1_HEADER_BYTES,
                    f64::from_le_bytes(f(24)),
                    0,
                    0.0,
                    0,
                    None,
                ),
                2..=4 => {
                    let header = match version {
                        2 => V2_HEADER_BYTES,
                        3 => V3_HEADER_BYTES,
                        _ => RECORD_HEADER_BYTES,
                    };
                    if bytes.len() < header {
                        return Err(bad(format!("{} bytes: a truncated header", bytes.len())));
                    }
                    let phase = match u(20) {
                        0 => Phase::Prefill,
                        1 => Phase::Decode,
                        p => return Err(bad(format!("unknown phase {p}"))),
                    };
                    let n = u(24) as usize;
                    let iso_n = if version >= 3 { u(52) as usize } else { 0 };
                    if iso_n != 0 && iso_n != n {
                        return Err(bad(format!(
                            "{iso_n} per-node isolation costs for {n} nodes"
                        )));
                    }
                    (
                        phase,
                        n,
                        header,
                        f64::from_le_bytes(f(28)),
                        u64::from_le_bytes(f(36)),
                        f64::from_le_bytes(f(44)),
                        iso_n,
                        Some(f64::from_le_bytes(f(56)))
                            .filter(|v| version >= 4 && *v != f64::INFINITY),
                    )
                }
                v => {
                    return Err(bad(format!(
                        "record version {v} (this opledger reads 1 to {RECORD_VERSION})"
                    )))
                }
            };
        let expected = header as u64 + 4 * (n + iso_n) as u64;
        if bytes.len() as u64 != expected {
            return Err(bad(format!(
                "{} bytes for {n} nodes (expected {expected})",
                bytes.len()
            )));
        }
        let floats: Vec<f32> = bytes[header..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (node_us, isolation_node_us) = floats.split_at(n);
        let (node_us, isolation_node_us) = (node_us.to_vec(), isolation_node_us.to_vec());
        Ok(ChunkRecord {
            cycle: u(8),
            mode,
            chunk: u(16),
            phase,
            wall_ms,
            output_hash,
            isolation_us,
            isolation_node_us,
            node_us,
            outputs_nmse,
        })
    }
}

/// Wall time one mode spent in one cycle, for the cost of a sweep against a plain prefill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassLog {
    pub cycle: u32,
    pub mode: Mode,
    /// The chunk the pass (re)started at: > 0 after a resume.
    pub first_chunk: u32,
    /// Untimed refill of the chunks before `first_chunk`.
    pub fill_ms: f64,
    /// Everything the mode cost in the cycle: fill, its units, storing.
    pub total_ms: f64,
    /// Units measured while other processes used more than the noise gate allows, or between
    /// two slowed canaries (a cumulative pass cannot retake a chunk: they are counted, not
    /// rejected).
    #[serde(default)]
    pub noisy_chunks: u32,
}

/// Where records go as they land, and what is already there.
pub trait ChunkStore {
    /// Chunks of (cycle, mode, phase) already stored.
    fn stored(&self, cycle: u32, mode: Mode, phase: Phase) -> Result<Vec<u32>, SweepError>;
    fn store(&mut self, record: &ChunkRecord) -> Result<(), SweepError>;
    fn store_pass(&mut self, log: &PassLog) -> Result<(), SweepError>;
}

/// Records in memory (tests).
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub records: Vec<ChunkRecord>,
    pub passes: Vec<PassLog>,
}

impl ChunkStore for MemoryStore {
    fn stored(&self, cycle: u32, mode: Mode, phase: Phase) -> Result<Vec<u32>, SweepError> {
        Ok(self
            .records
            .iter()
            .filter(|r| r.cycle == cycle && r.mode == mode && r.phase == phase)
            .map(|r| r.chunk)
            .collect())
    }

    fn store(&mut self, record: &ChunkRecord) -> Result<(), SweepError> {
        if self.records.iter().any(|r| {
            (r.cycle, r.mode, r.chunk, r.phase)
                == (record.cycle, record.mode, record.chunk, record.phase)
        }) {
            return Err(SweepError::Store(format!(
                "{} stored twice",
                ChunkRecord::file_name(record.cycle, record.mode, record.chunk, record.phase)
            )));
        }
        self.records.push(record.clone());
        Ok(())
    }

    fn store_pass(&mut self, log: &PassLog) -> Result<(), SweepError> {
        self.passes.push(log.clone());
        Ok(())
    }
}

/// Records in a run folder: `chunks/*.bin` and `passes/*.json`, each written once.
pub struct FolderStore {
    folder: crate::run_folder::RunFolder,
}

impl FolderStore {
    pub fn new(folder: crate::run_folder::RunFolder) -> FolderStore {
        FolderStore { folder }
    }

    pub fn folder(&self) -> &crate::run_folder::RunFolder {
        &self.folder
    }

    pub fn into_folder(self) -> crate::run_folder::RunFolder {
        self.folder
    }
}

fn store_err(e: impl std::fmt::Display) -> SweepError {
    SweepError::Store(e.to_string())
}

impl ChunkStore for FolderStore {
    fn stored(&self, cycle: u32, mode: Mode, phase: Phase) -> Result<Vec<u32>, SweepError> {
        let dir = self.folder.path().join("chunks");
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let prefix = format!("c{cycle:03}-{}-", mode_name(mode));
        let suffix = match phase {
            Phase::Prefill => ".bin",
            Phase::Decode => "-decode.bin",
        };
        let mut out = Vec::new();
        for entry in
            std::fs::read_dir(&dir).map_err(|e| store_err(format!("{}: {e}", dir.display())))?
        {
            let name = entry.map_err(store_err)?.file_name();
            let name = name.to_string_lossy();
            let Some(n) = name
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(suffix))
            else {
                continue;
            };
            // a prefill name's number is digits only; a decode name ends in -decode
            if !n.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            out.push(
                n.parse()
                    .map_err(|_| store_err(format!("{}: unexpected file {name}", dir.display())))?,
            );
        }
        Ok(out)
    }

    fn store(&mut self, record: &ChunkRecord) -> Result<(), SweepError> {
        let name = format!(
            "chunks/{}",
            ChunkRecord::file_name(record.cycle, record.mode, record.chunk, record.phase)
        );
        self.folder
            .write(&name, &record.encode())
            .map_err(store_err)?;
        Ok(())
    }

    fn store_pass(&mut self, log: &PassLog) -> Result<(), SweepError> {
        let name = format!(
            "passes/c{:03}-{}-from{:05}.json",
            log.cycle,
            mode_name(log.mode),
            log.first_chunk
        );
        self.folder.write_json(&name, log).map_err(store_err)?;
        Ok(())
    }
}

/// Reads every chunk record and pass log of a run folder.
pub fn load_folder(dir: &std::path::Path) -> Result<(Vec<ChunkRecord>, Vec<PassLog>), SweepError> {
    let mut records = Vec::new();
    let chunks = dir.join("chunks");
    if chunks.is_dir() {
        let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(&chunks)
            .map_err(|e| store_err(format!("{}: {e}", chunks.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        names.sort();
        for p in names {
            let bytes =
                std::fs::read(&p).map_err(|e| store_err(format!("{}: {e}", p.display())))?;
            records.push(ChunkRecord::decode(&bytes, &p.display().to_string())?);
        }
    }
    let mut passes = Vec::new();
    let pdir = dir.join("passes");
    if pdir.is_dir() {
        let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(&pdir)
            .map_err(|e| store_err(format!("{}: {e}", pdir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        names.sort();
        for p in names {
            passes.push(crate::run_folder::read_json(&p).map_err(store_err)?);
        }
    }
    Ok((records, passes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phase: Phase) -> ChunkRecord {
        ChunkRecord {
            cycle: 2,
            mode: Mode::Timed,
            chunk: 17,
            phase,
            wall_ms: 123.25,
            output_hash: 0xdead_beef_0123_4567,
            isolation_us: 0.75,
            isolation_node_us: if phase == Phase::Decode {
                vec![0.5, 0.0, 3.25]
            } else {
                Vec::new()
            },
            node_us: vec![1.5, 0.0, 1e6],
            outputs_nmse: (phase == Phase::Prefill).then_some(3.05e-6),
        }
    }

    #[test]
    fn record_round_trip_and_errors() {
        for phase in [Phase::Prefill, Phase::Decode] {
            let r = record(phase);
            let bytes = r.encode();
            let floats = 3 + r.isolation_node_us.len();
            assert_eq!(bytes.len(), RECORD_HEADER_BYTES + 4 * floats);
            assert_eq!(ChunkRecord::decode(&bytes, "x").unwrap(), r);
        }
        // a compared row that was not finite stays NaN, apart from "not compared"
        let mut r = record(Phase::Prefill);
        r.outputs_nmse = Some(f64::NAN);
        let back = ChunkRecord::decode(&r.encode(), "x").unwrap();
        assert!(back.outputs_nmse.is_some_and(f64::is_nan));
        let bytes = record(Phase::Prefill).encode();
        let err = ChunkRecord::decode(&bytes[..bytes.len() - 1], "c.bin").unwrap_err();
        assert!(err.to_string().starts_with("c.bin: "), "{err}");
        assert!(ChunkRecord::decode(b"nope", "x").is_err());
        let mut wrong = bytes.clone();
        wrong[4] = 9;
        assert!(ChunkRecord::decode(&wrong, "x")
            .unwrap_err()
            .to_string()
            .contains("record version 9"));
    }

    #[test]
    fn version_one_records_still_read_as_prefill_chunks() {
        // magic, version 1, cycle 1, mode fused (0), chunk 3, 0 nodes, wall 42.5
        let mut v1 = b"OPLC".to_vec();
        for v in [1u32, 1, 0, 3, 0] {
            v1.extend_from_slice(&v.to_le_bytes());
        }
        v1.extend_from_slice(&42.5f64.to_le_bytes());
        let r = ChunkRecord::decode(&v1, "old.bin").unwrap();
        assert_eq!(
            (r.cycle, r.mode, r.chunk, r.phase, r.wall_ms, r.output_hash),
            (1, Mode::Fused, 3, Phase::Prefill, 42.5, 0)
        );
    }

    #[test]
    fn version_two_records_read_without_per_node_isolation() {
        // a version-2 record: the version-3 header without the per-node count
        let r = record(Phase::Decode);
        let v3 = r.encode();
        let mut v2 = v3[..V2_HEADER_BYTES].to_vec();
        v2[4..8].copy_from_slice(&2u32.to_le_bytes());
        v2.extend_from_slice(&v3[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + 12]);
        let old = ChunkRecord::decode(&v2, "v2.bin").unwrap();
        assert_eq!(old.node_us, r.node_us);
        assert_eq!(old.isolation_us, 0.75);
        assert!(old.isolation_node_us.is_empty());
        // a per-node count that is neither 0 nor the node count is refused
        let mut bad = v3.clone();
        bad[52..56].copy_from_slice(&2u32.to_le_bytes());
        let e = ChunkRecord::decode(&bad, "bad.bin")
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 per-node isolation costs for 3 nodes"), "{e}");
    }

    #[test]
    fn version_three_records_read_without_the_outputs_nmse() {
        // a version-3 record: the version-4 header without the NMSE
        let r = record(Phase::Decode);
        let v4 = r.encode();
        let mut v3 = v4[..V3_HEADER_BYTES].to_vec();
        v3[4..8].copy_from_slice(&3u32.to_le_bytes());
        v3.extend_from_slice(&v4[RECORD_HEADER_BYTES..]);
        let old = ChunkRecord::decode(&v3, "v3.bin").unwrap();
        assert_eq!(
            old,
            ChunkRecord {
                outputs_nmse: None,
                ..r
            }
        );
    }

    #[test]
    fn file_names_keep_prefill_and_decode_apart() {
        assert_eq!(
            ChunkRecord::file_name(0, Mode::Timed, 12, Phase::Prefill),
            "c000-timed-00012.bin"
        );
        assert_eq!(
            ChunkRecord::file_name(0, Mode::Timed, 12, Phase::Decode),
            "c000-timed-00012-decode.bin"
        );
    }
}
