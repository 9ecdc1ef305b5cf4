//! SQL for people who keep results in SQLite: one row per run in `opledger_runs` and one per
//! band of every test in `opledger_run_bands`, keyed by the run's id (the BLAKE3 of its
//! manifest), so loading a run twice keeps one copy and a history of runs can be queried
//! (`sqlite3 results.db < results.sql`, once per run).

use std::fmt::Write as _;

use opledger_core::manifest::Manifest;

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

/// A row of `opledger_run_bands` is one band of one test of one side of one run.
const KEY: &str = "run_id, config, test, band";

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
pub fn sql(m: &Manifest, rows: &[BenchRow]) -> String {
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
    let _ = writeln!(out, "BEGIN TRANSACTION;");
    let names = |columns: &[(&str, &str)]| {
        columns
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = rows.first();
    let run = [
        quote(&id),
        quote(&m.created_utc),
        quote(&m.tool),
        quote(&m.command),
        quote(&serde_json::to_string(&m.args).expect("strings serialise")),
        quote(first.map_or(m.model_label(), |r| r.model.as_str())),
        quote(&m.model.path),
        m.model.size_bytes.to_string(),
        quote(&m.model.blake3),
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
                quote(&m.model.path),
                r.size_bytes.to_string(),
                quote(&m.model.blake3),
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
    let _ = writeln!(out, "COMMIT;");
    out
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
