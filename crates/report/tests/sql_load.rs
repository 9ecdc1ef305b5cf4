//! `results.sql` loaded into SQLite (python3's sqlite3 module, as `scripts/fetch-models` already
//! needs python3): a run loaded twice is one run, two runs are told apart by their ids, and the
//! history of runs can be queried.

mod fixture;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use opledger_report::{render, AbView, Format, ProfileView, RenderOptions, RunView};

/// Loads each script in turn into the database at `db` (foreign keys enforced, the first error
/// fails), then prints the answer of `query`, one row a line, fields separated by `|`.
fn sqlite(db: &Path, scripts: &[&str], query: &str) -> Vec<String> {
    let program = r#"
import sqlite3, sys, json
db, query, scripts = sys.argv[1], sys.argv[2], json.load(sys.stdin)
con = sqlite3.connect(db, isolation_level=None)
con.execute("PRAGMA foreign_keys = ON")
for s in scripts:
    con.executescript(s)
for row in con.execute(query):
    print("|".join("" if v is None else str(v) for v in row))
"#;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(program)
        .arg(db)
        .arg(query)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/install-deps' machines have it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(scripts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "sqlite3 refused the script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn inserts(script: &str, table: &str) -> usize {
    script
        .lines()
        .filter(|l| l.contains(&format!(" INTO {table} (")))
        .count()
}

#[test]
fn a_run_loaded_twice_is_one_run_and_runs_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let manifest = fixture::manifest("profile");
    let raw = fixture::profile_raw();
    let sql = |m: &opledger_core::manifest::Manifest| {
        let view = RunView::Profile(ProfileView::new(m, &raw).unwrap());
        String::from_utf8(render(&view, Format::Sql, &RenderOptions::default()).unwrap()).unwrap()
    };
    let first = sql(&manifest);
    let bands = inserts(&first, "opledger_run_bands");
    assert!(bands >= 4, "{first}");
    assert_eq!(inserts(&first, "opledger_runs"), 1);
    // the same run twice: one run, its rows once
    let count =
        "SELECT (SELECT count(*) FROM opledger_runs), (SELECT count(*) FROM opledger_run_bands)";
    assert_eq!(
        sqlite(&db, &[&first, &first], count),
        [format!("1|{bands}")]
    );
    // another run of the same work an hour later: a second id, its own rows
    let mut later = manifest.clone();
    later.created_utc = "2026-01-15T10:30:00Z".into();
    let second = sql(&later);
    assert_ne!(
        opledger_report::sql::run_id(&manifest),
        opledger_report::sql::run_id(&later)
    );
    assert_eq!(
        sqlite(&db, &[&second, &first], count),
        [format!("2|{}", 2 * bands)]
    );
    // the history: one line per run, oldest first, each with its bands
    let history = sqlite(
        &db,
        &[],
        "SELECT r.created_utc, r.command, count(b.band) FROM opledger_runs r \
         JOIN opledger_run_bands b USING (run_id) GROUP BY r.run_id ORDER BY r.created_utc",
    );
    assert_eq!(
        history,
        [
            format!("2026-01-15T09:30:00Z|profile|{bands}"),
            format!("2026-01-15T10:30:00Z|profile|{bands}")
        ]
    );
    // an A/B's two sides are rows of their own (the config is part of the key)
    let ab_manifest = fixture::manifest("ab");
    let ab = fixture::ab_report();
    let view = RunView::Ab(AbView {
        manifest: &ab_manifest,
        report: &ab,
    });
    let ab_sql =
        String::from_utf8(render(&view, Format::Sql, &RenderOptions::default()).unwrap()).unwrap();
    let ab_rows = inserts(&ab_sql, "opledger_run_bands");
    let configs = sqlite(
        &db,
        &[&ab_sql, &ab_sql],
        "SELECT count(DISTINCT config), count(*) FROM opledger_run_bands WHERE command = 'ab'",
    );
    assert_eq!(configs, [format!("2|{ab_rows}")]);
}

/// A profile on a device with its own clock (the mock's scripted clock, every node on
/// `Vulkan0`): one row per band in `opledger_run_device_clock_bands`, once however often the
/// run is loaded, each with the summary's host-over-device ratio.
#[test]
fn a_profile_with_the_device_clock_loads_its_bands_on_both_clocks() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let m = fixture::manifest("profile");
    let (_, raw) = fixture::device_clock_profile();
    let v = ProfileView::new(&m, &raw).unwrap();
    let clock = v.summary.device_clock.clone().expect("a device clock");
    let script = String::from_utf8(
        render(&RunView::Profile(v), Format::Sql, &RenderOptions::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        inserts(&script, "opledger_run_device_clock_bands"),
        clock.bands.len()
    );
    let rows = sqlite(
        &db,
        &[&script, &script],
        "SELECT band, nodes, host_over_device, host_timed_ms_per_token / device_timed_ms_per_token \
         FROM opledger_run_device_clock_bands ORDER BY band",
    );
    let mut want: Vec<_> = clock.bands.iter().collect();
    want.sort_by(|a, b| a.band.cmp(&b.band));
    assert_eq!(rows.len(), want.len(), "{rows:?}");
    for (row, b) in rows.iter().zip(want) {
        let f: Vec<&str> = row.split('|').collect();
        assert_eq!(
            (f[0], f[1]),
            (b.band.as_str(), b.nodes.to_string().as_str())
        );
        let ratio: f64 = f[2].parse().unwrap();
        let of_medians: f64 = f[3].parse().unwrap();
        assert!(
            (ratio - b.timed_ratio).abs() < 1e-9 * b.timed_ratio,
            "{row}"
        );
        assert!((ratio - of_medians).abs() < 1e-9 * ratio, "{row}");
    }
    // a profile without the clock makes no such table
    let plain = fixture::profile_raw();
    let plain = String::from_utf8(
        render(
            &RunView::Profile(ProfileView::new(&m, &plain).unwrap()),
            Format::Sql,
            &RenderOptions::default(),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(!plain.contains("opledger_run_device_clock_bands"));
}
