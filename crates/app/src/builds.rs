//! Two builds set against each other must be two builds: an A/B whose sides name different
//! workers (`worker=` knobs) that turn out to be one binary (the same BLAKE3, as each engine
//! computed it of the worker it started) would present one build measured twice as a
//! comparison of two, so it is refused. An A/A of one build is asked for by naming the same
//! worker on both sides (or none), and knob A/Bs on one worker are not touched.

use anyhow::{bail, Result};
use opledger_core::ab::Knobs;
use opledger_core::engine::EngineInfo;

/// The engine setting holding the BLAKE3 of a worker binary (`opledger_worker::engine`).
const WORKER_BLAKE3: &str = "worker_blake3";

/// Refuses an A/B whose sides name different workers that are one binary.
pub fn check_two_builds(
    a: &Knobs,
    b: &Knobs,
    a_info: &EngineInfo,
    b_info: &EngineInfo,
) -> Result<()> {
    if a.get("worker") == b.get("worker") {
        return Ok(());
    }
    let (Some(ha), Some(hb)) = (
        a_info.settings.get(WORKER_BLAKE3),
        b_info.settings.get(WORKER_BLAKE3),
    ) else {
        return Ok(());
    };
    if ha != hb {
        return Ok(());
    }
    let side = |k: &Knobs, i: &EngineInfo| {
        let path = i.settings.get("worker").map(String::as_str).unwrap_or("?");
        match k.get("worker") {
            Some(w) if w == path => format!("worker={w}"),
            Some(w) => format!("worker={w} ({path})"),
            None => format!("no worker knob ({path})"),
        }
    };
    bail!(
        "--a {} and --b {} are one binary (BLAKE3 {ha}): an A/B of two builds needs two different builds (was the second built over the first, or copied from it?); an A/A of one build is asked for by naming the same worker on both sides",
        side(a, a_info),
        side(b, b_info)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn knobs(s: &str) -> Knobs {
        s.parse().unwrap()
    }

    fn info(worker: &str, blake3: Option<&str>) -> EngineInfo {
        let mut settings = BTreeMap::new();
        settings.insert("worker".to_string(), worker.to_string());
        if let Some(h) = blake3 {
            settings.insert(WORKER_BLAKE3.to_string(), h.to_string());
        }
        EngineInfo {
            engine: "llama.cpp".into(),
            version: "worker: b1".into(),
            backend: "CPU".into(),
            threads: 2,
            settings,
        }
    }

    #[test]
    fn two_paths_to_one_binary_are_refused() {
        let (a, b) = (knobs("worker=/m/w"), knobs("worker=/b/w"));
        let e = check_two_builds(&a, &b, &info("/m/w", Some("h1")), &info("/b/w", Some("h1")))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--a worker=/m/w and --b worker=/b/w are one binary (BLAKE3 h1): an A/B of two builds needs two different builds (was the second built over the first, or copied from it?); an A/A of one build is asked for by naming the same worker on both sides"
        );
    }

    #[test]
    fn a_knob_against_the_default_worker_is_refused_too() {
        // `worker=bundled` resolves to a path: both are named
        let (a, b) = (knobs(""), knobs("worker=bundled"));
        let e = check_two_builds(&a, &b, &info("/x/w", Some("h")), &info("/x/w", Some("h")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "--a no worker knob (/x/w) and --b worker=bundled (/x/w) are one binary (BLAKE3 h)"
            ),
            "{e}"
        );
    }

    #[test]
    fn two_binaries_pass() {
        let (a, b) = (knobs("worker=/m/w"), knobs("worker=/b/w"));
        check_two_builds(&a, &b, &info("/m/w", Some("h1")), &info("/b/w", Some("h2"))).unwrap();
    }

    #[test]
    fn one_worker_named_on_both_sides_is_an_aa_or_a_knob_ab() {
        let same = info("/m/w", Some("h1"));
        check_two_builds(&knobs("worker=/m/w"), &knobs("worker=/m/w"), &same, &same).unwrap();
        check_two_builds(
            &knobs("worker=/m/w"),
            &knobs("worker=/m/w,threads=4"),
            &same,
            &same,
        )
        .unwrap();
        check_two_builds(&knobs(""), &knobs("threads=4"), &same, &same).unwrap();
    }

    #[test]
    fn an_engine_without_a_worker_hash_is_not_judged() {
        let (a, b) = (knobs("worker=/m/w"), knobs("worker=/b/w"));
        check_two_builds(&a, &b, &info("/m/w", None), &info("/b/w", Some("h1"))).unwrap();
        check_two_builds(&a, &b, &info("/m/w", None), &info("/b/w", None)).unwrap();
    }
}
