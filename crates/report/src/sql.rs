//! SQL for people who keep results in SQLite: one row per run in `opledger_runs` and one per
//! band of every test in `opledger_run_bands`, keyed by the run's id (the BLAKE3 of its
//! manifest), so loading a run twice keeps one copy and a history of runs can be queried
//! (`sqlite3 results.db < results.sql`, once per run).

use std::fmt::Write as _;

use opledger_core::manifest::Manifest;

use opledger_core::device::DeviceStats;
use opledger_core::device_clock::DeviceClockSummary;

use crate::bench::BenchRow;

/// One row per run.
pub const RUNS: &str = "opledger_runs";
/// One row per band of every test of a run.
pub const TABLE: &str = "opledger_run_bands";

const RUN_COLUMNS: [(&str, &str); 14] = [
    ("run_id", "TEXT PRIMARY KEY"),
    ("created_utc", "TEXT NOT NULL"),
    ("tool", "TEXT NOT NULL"),
    ("command", "TEXT NOT NULL"),
    ("args", "TEXT"),
    ("model", "TEXT NOT NULL"),
    ("model_path", "TEXT"),
    ("model_size_bytes", "INTEGER"),
    ("model_blake3", "TEXT"),
    ("arch", "TEXT"),
    ("engine", "TEXT"),
    ("engine_version", "TEXT"),
    ("backend", "TEXT"),
    ("threads", "INTEGER"),
];

const COLUMNS: [(&str, &str); 22] = [
    ("run_id", "TEXT NOT NULL REFERENCES opledger_runs(run_id)"),
    ("created_utc", "TEXT NOT NULL"),
    ("tool", "TEXT NOT NULL"),
    ("command", "TEXT NOT NULL"),
    ("model", "TEXT NOT NULL"),
    ("model_path", "TEXT"),
    ("model_size_bytes", "INTEGER"),
    ("model_blake3", "TEXT"),
    ("params", "INTEGER"),
    ("arch", "TEXT"),
    ("engine", "TEXT"),
    ("engine_version", "TEXT"),
    ("backend", "TEXT"),
    ("threads", "INTEGER"),
    ("config", "TEXT NOT NULL"),
    ("test", "TEXT NOT NULL"),
    ("n_tokens", "INTEGER"),
    ("n_depth", "INTEGER"),
    ("t_per_s", "REAL"),
    ("band", "TEXT NOT NULL"),
    ("ms_per_token", "REAL"),
    ("share", "REAL"),
];

/// A profile with the device's own clock (`core::device_clock`): one row per band, the host's
/// TIMED time and the device's for the same nodes, their ratio, the device's FUSED time and the
/// band's figure (ms/token; medians with the cycles' range).
pub const DEVICE_CLOCK_BANDS: &str = "opledger_run_device_clock_bands";

const DEVICE_CLOCK_COLUMNS: [(&str, &str); 15] = [
    ("run_id", "TEXT NOT NULL REFERENCES opledger_runs(run_id)"),
    ("band", "TEXT NOT NULL"),
    ("source", "TEXT"),
    ("nodes", "INTEGER"),
    ("host_timed_ms_per_token", "REAL"),
    ("host_timed_ms_per_token_min", "REAL"),
    ("host_timed_ms_per_token_max", "REAL"),
    ("device_timed_ms_per_token", "REAL"),
    ("device_timed_ms_per_token_min", "REAL"),
    ("device_timed_ms_per_token_max", "REAL"),
    ("host_over_device", "REAL"),
    ("device_fused_ms_per_token", "REAL"),
    ("device_fused_ms_per_token_min", "REAL"),
    ("device_fused_ms_per_token_max", "REAL"),
    ("ms_per_token", "REAL"),
];

/// A row of `opledger_run_bands` is one band of one test of one side of one run.
const KEY: &str = "run_id, config, test, band";

/// An imported trace with device activity: one row per run of its device figures (medians over
/// steps, milliseconds a step) ...
pub const DEVICE: &str = "opledger_run_device";
/// ... and one row per band, the host's self time and the device's time per token side by side.
pub const DEVICE_BANDS: &str = "opledger_run_device_bands";

const DEVICE_COLUMNS: [(&str, &str); 15] = [
    (
        "run_id",
        "TEXT PRIMARY KEY REFERENCES opledger_runs(run_id)",
    ),
    ("activities", "INTEGER"),
    ("devices", "INTEGER"),
    ("streams", "INTEGER"),
    ("busy_ms", "REAL"),
    ("activity_ms", "REAL"),
    ("stream_concurrency", "REAL"),
    ("step_wall_ms", "REAL"),
    ("step_wall_with_device_ms", "REAL"),
    ("outside_steps", "INTEGER"),
    ("outside_steps_ms", "REAL"),
    ("unlinked", "INTEGER"),
    ("unlinked_ms", "REAL"),
    ("links_dropped", "INTEGER"),
    ("steps", "INTEGER"),
];

const DEVICE_BAND_COLUMNS: [(&str, &str); 8] = [
    ("run_id", "TEXT NOT NULL REFERENCES opledger_runs(run_id)"),
    ("band", "TEXT NOT NULL"),
    ("host_ms_per_token", "REAL"),
    ("host_ms_per_token_min", "REAL"),
    ("host_ms_per_token_max", "REAL"),
    ("device_ms_per_token", "REAL"),
    ("device_ms_per_token_min", "REAL"),
    ("device_ms_per_token_max", "REAL"),
];

/// A run's id: the BLAKE3 of its manifest as JSON (what was run, when, with what, on what
/// machine), the first 32 hex digits. The same stored run always has the same id.
pub fn run_id(m: &Manifest) -> String {
    let json = serde_json::to_vec(m).expect("a manifest serialises");
    blake3::hash(&json).to_hex()[..32].to_string()
}

/// A string literal: single quotes, embedded quotes doubled, NUL bytes dropped (SQLite's text
/// cannot hold them through the shell).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\0' => {}
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A REAL: the shortest form that reads back to the same f64; NULL for NaN and infinities.
pub fn real(x: f64) -> String {
    if x.is_finite() {
        format!("{x:?}")
    } else {
        "NULL".into()
    }
}

/// Text for a `--` comment line: a line break would end the comment.
fn comment(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

fn create(out: &mut String, table: &str, columns: &[(&str, &str)], key: Option<&str>) {
    let _ = writeln!(out, "CREATE TABLE IF NOT EXISTS {table} (");
    for (i, (name, ty)) in columns.iter().enumerate() {
        let comma = if i + 1 < columns.len() || key.is_some() {
            ","
        } else {
            ""
        };
        let _ = writeln!(out, "  {name} {ty}{comma}");
    }
    if let Some(key) = key {
        let _ = writeln!(out, "  PRIMARY KEY ({key})");
    }
    let _ = writeln!(out, ");");
}

/// The script: the tables, then the run and its rows in one transaction. A run already loaded
/// is the same run (its id is its manifest's hash): its row is kept and its band rows are
/// replaced, so loading it again changes nothing.
pub fn sql(
    m: &Manifest,
    rows: &[BenchRow],
    device: Option<&DeviceStats>,
    clock: Option<&DeviceClockSummary>,
) -> String {
    let id = run_id(m);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "-- {}: {} run {id} of {} ({}), created {}\n-- one row per run in {RUNS}, one per band of every test in {TABLE}; ms_per_token = band share of the TIMED time x FUSED wall / tokens",
        comment(&m.tool),
        comment(&m.command),
        comment(m.model_label()),
        comment(&m.model.blake3),
        comment(&m.created_utc)
    );
    create(&mut out, RUNS, &RUN_COLUMNS, None);
    create(&mut out, TABLE, &COLUMNS, Some(KEY));
    if device.is_some() {
        create(&mut out, DEVICE, &DEVICE_COLUMNS, None);
        create(
            &mut out,
            DEVICE_BANDS,
            &DEVICE_BAND_COLUMNS,
            Some("run_id, band"),
        );
    }
    if clock.is_some() {
        create(
            &mut out,
            DEVICE_CLOCK_BANDS,
            &DEVICE_CLOCK_COLUMNS,
            Some("run_id, band"),
        );
    }
    let _ = writeln!(out, "BEGIN TRANSACTION;");
    let names = |columns: &[(&str, &str)]| {
        columns
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = rows.first();
    // a run imported without its model recorded no model file: NULL, not its trace, 0 or ''
    let recorded = crate::view::model_recorded(m);
    let or_null = |v: String| if recorded { v } else { "NULL".into() };
    let model_path = or_null(quote(&m.model.path));
    let size = or_null(m.model.size_bytes.to_string());
    let blake3 = or_null(quote(&m.model.blake3));
    let run = [
        quote(&id),
        quote(&m.created_utc),
        quote(&m.tool),
        quote(&m.command),
        quote(&serde_json::to_string(&m.args).expect("strings serialise")),
        quote(first.map_or(m.model_label(), |r| r.model.as_str())),
        model_path.clone(),
        size.clone(),
        blake3.clone(),
        quote(&m.model.arch.arch),
        quote(&m.engine.engine),
        quote(&m.engine.version),
        quote(first.map_or(m.engine.backend.as_str(), |r| r.backend.as_str())),
        m.engine.threads.to_string(),
    ];
    let _ = writeln!(
        out,
        "INSERT OR IGNORE INTO {RUNS} ({}) VALUES ({});",
        names(&RUN_COLUMNS),
        run.join(", ")
    );
    let names = names(&COLUMNS);
    for r in rows {
        let total: f64 = r
            .bands
            .iter()
            .map(|(_, v)| v)
            .filter(|v| v.is_finite())
            .sum();
        for (band, ms) in &r.bands {
            let share = if total > 0.0 { ms / total } else { f64::NAN };
            let values = [
                quote(&id),
                quote(&m.created_utc),
                quote(&m.tool),
                quote(&m.command),
                quote(&r.model),
                model_path.clone(),
                size.clone(),
                blake3.clone(),
                r.params
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "NULL".into()),
                quote(&m.model.arch.arch),
                quote(&m.engine.engine),
                quote(&m.engine.version),
                quote(&r.backend),
                r.threads.to_string(),
                quote(&r.config),
                quote(&r.test),
                r.tokens.to_string(),
                r.depth_tokens.to_string(),
                real(r.tok_per_s),
                quote(band),
                real(*ms),
                real(share),
            ];
            let _ = writeln!(
                out,
                "INSERT OR REPLACE INTO {TABLE} ({names}) VALUES ({});",
                values.join(", ")
            );
        }
    }
    if let Some(d) = device {
        device_rows(&mut out, &id, d);
    }
    if let Some(c) = clock {
        device_clock_rows(&mut out, &id, c);
    }
    let _ = writeln!(out, "COMMIT;");
    out
}

/// The device ledger's rows, replaced when the run is loaded again.
fn device_rows(out: &mut String, id: &str, d: &DeviceStats) {
    let names = |columns: &[(&str, &str)]| {
        columns
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let values = [
        quote(id),
        d.activities.to_string(),
        d.devices.to_string(),
        d.streams.to_string(),
        real(d.busy_ms.median),
        real(d.activity_ms.median),
        real(d.stream_concurrency.map_or(f64::NAN, |c| c.median)),
        real(d.step_wall_ms.median),
        real(d.step_wall_with_device_ms.median),
        d.outside_steps.to_string(),
        real(d.outside_steps_ms),
        d.unlinked.to_string(),
        real(d.unlinked_ms),
        d.links_dropped.to_string(),
        d.step_wall_ms.n.to_string(),
    ];
    let _ = writeln!(
        out,
        "INSERT OR REPLACE INTO {DEVICE} ({}) VALUES ({});",
        names(&DEVICE_COLUMNS),
        values.join(", ")
    );
    for b in d.bands_with_time() {
        let (h, v) = (&b.host_ms_per_token, &b.device_ms_per_token);
        let values = [
            quote(id),
            quote(&b.band),
            real(h.median),
            real(h.min),
            real(h.max),
            real(v.median),
            real(v.min),
            real(v.max),
        ];
        let _ = writeln!(
            out,
            "INSERT OR REPLACE INTO {DEVICE_BANDS} ({}) VALUES ({});",
            names(&DEVICE_BAND_COLUMNS),
            values.join(", ")
        );
    }
}

/// The device clock's rows, one per band, replaced when the run is loaded again.
fn device_clock_rows(out: &mut String, id: &str, c: &DeviceClockSummary) {
    let names = DEVICE_CLOCK_COLUMNS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ");
    for b in &c.bands {
        let (h, d, f) = (
            &b.host_timed_ms_per_token,
            &b.device_timed_ms_per_token,
            &b.device_fused_ms_per_token,
        );
        let values = [
            quote(id),
            quote(&b.band),
            quote(&c.source),
            b.nodes.to_string(),
            real(h.median),
            real(h.min),
            real(h.max),
            real(d.median),
            real(d.min),
            real(d.max),
            real(b.timed_ratio),
            real(f.median),
            real(f.min),
            real(f.max),
            real(b.ms_per_token),
        ];
        let _ = writeln!(
            out,
            "INSERT OR REPLACE INTO {DEVICE_CLOCK_BANDS} ({names}) VALUES ({});",
            values.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_and_numbers_exact() {
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote("a'; DROP TABLE x; --"), "'a''; DROP TABLE x; --'");
        assert_eq!(quote("nul\0byte"), "'nulbyte'");
        assert_eq!(real(0.1), "0.1");
        assert_eq!(real(3.0), "3.0");
        assert_eq!(real(f64::NAN), "NULL");
        assert_eq!(real(f64::INFINITY), "NULL");
        assert_eq!(real(1e-7), "1e-7");
    }
}
