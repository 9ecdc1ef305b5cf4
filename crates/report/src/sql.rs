//! SQL for people who keep results in SQLite: `CREATE TABLE IF NOT EXISTS opledger_bands` and
//! one `INSERT` per band of every test, in one transaction (`sqlite3 results.db < results.sql`).

use std::fmt::Write as _;

use opledger_core::manifest::Manifest;

use crate::bench::BenchRow;

/// The table every run's rows go to.
pub const TABLE: &str = "opledger_bands";

const COLUMNS: [(&str, &str); 21] = [
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
    ("config", "TEXT"),
    ("test", "TEXT NOT NULL"),
    ("n_tokens", "INTEGER"),
    ("n_depth", "INTEGER"),
    ("t_per_s", "REAL"),
    ("band", "TEXT NOT NULL"),
    ("ms_per_token", "REAL"),
    ("share", "REAL"),
];

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

/// The script: the table, then the rows in one transaction.
pub fn sql(m: &Manifest, rows: &[BenchRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "-- {}: {} run of {} ({}), created {}\n-- one row per band of every test; ms_per_token = band share of the TIMED time x FUSED wall / tokens",
        comment(&m.tool),
        comment(&m.command),
        comment(m.model_label()),
        comment(&m.model.blake3),
        comment(&m.created_utc)
    );
    let _ = writeln!(out, "CREATE TABLE IF NOT EXISTS {TABLE} (");
    for (i, (name, ty)) in COLUMNS.iter().enumerate() {
        let comma = if i + 1 < COLUMNS.len() { "," } else { "" };
        let _ = writeln!(out, "  {name} {ty}{comma}");
    }
    let _ = writeln!(out, ");\nBEGIN TRANSACTION;");
    let names: Vec<&str> = COLUMNS.iter().map(|(n, _)| *n).collect();
    let names = names.join(", ");
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
                "INSERT INTO {TABLE} ({names}) VALUES ({});",
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
