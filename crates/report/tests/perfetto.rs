//! The Perfetto trace checked against the trace-event format's rules on the rendered bytes:
//! complete events (`ph` X) with non-negative microsecond `ts` and `dur`, `pid` and `tid` on
//! every event, tracks named by metadata events, and events on one track that never partially
//! overlap (Perfetto would move them to overflow tracks).

mod fixture;

use std::collections::{BTreeMap, BTreeSet};

use opledger_report::perfetto::{median_cycle, trace_json, TraceTracks};
use opledger_report::ProfileView;
use serde_json::Value;

/// Checks the rules; returns the complete events in file order.
fn validate(bytes: &[u8]) -> Vec<Value> {
    let doc: Value = serde_json::from_slice(bytes).expect("the trace is JSON");
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    let mut named: BTreeSet<u64> = BTreeSet::new();
    let mut complete = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().expect("every event has a phase");
        assert!(e["pid"].is_u64(), "pid: {e}");
        assert!(e["tid"].is_u64(), "tid: {e}");
        assert!(e["name"].is_string(), "name: {e}");
        match ph {
            "M" => {
                if e["name"] == "thread_name" {
                    assert!(e["args"]["name"].is_string(), "{e}");
                    named.insert(e["tid"].as_u64().unwrap());
                }
            }
            "X" => {
                for key in ["ts", "dur"] {
                    let v = e[key].as_f64().unwrap_or_else(|| panic!("{key}: {e}"));
                    assert!(v.is_finite() && v >= 0.0, "{key} {v}: {e}");
                }
                complete.push(e.clone());
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    // per track: sorted by start, each event either ends before the next starts or contains it
    let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for e in &complete {
        let ts = e["ts"].as_f64().unwrap();
        let end = ts + e["dur"].as_f64().unwrap();
        tracks
            .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .or_default()
            .push((ts, end));
    }
    for ((_, tid), mut spans) in tracks {
        assert!(named.contains(&tid), "track {tid} has no thread_name");
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (start, end) in spans {
            while open.last().is_some_and(|&e| e <= start) {
                open.pop();
            }
            if let Some(&parent_end) = open.last() {
                assert!(
                    end <= parent_end,
                    "track {tid}: [{start}, {end}] partially overlaps an event ending at {parent_end}"
                );
            }
            open.push(end);
        }
    }
    complete
}

#[test]
fn the_trace_follows_the_trace_event_rules_and_lays_nodes_end_to_end() {
    let m = fixture::manifest("profile");
    let raw = fixture::profile_raw();
    let v = ProfileView::new(&m, &raw).unwrap();
    let cycle = median_cycle(&raw).unwrap();
    for tracks in [TraceTracks::Band, TraceTracks::Layer] {
        let bytes = trace_json(&m, &raw, &v.assignments, tracks).unwrap();
        let events = validate(&bytes);
        assert_eq!(events.len(), raw.graph.len());
        let mut end = 0.0;
        for (i, e) in events.iter().enumerate() {
            // node i starts where node i-1 ended, in graph order
            assert_eq!(e["ts"].as_f64().unwrap(), end, "node {i}");
            let dur = e["dur"].as_f64().unwrap();
            // on the 1/16 µs grid, without drift: each boundary within half a step
            assert!(
                (dur - raw.cycles[cycle].node_us[i]).abs() <= 1.0 / 16.0,
                "node {i}"
            );
            end = e["ts"].as_f64().unwrap() + dur;
            let args = &e["args"];
            assert_eq!(args["op"], raw.graph[i].op.as_str());
            assert_eq!(args["node"], raw.graph[i].name.as_str());
            assert_eq!(args["band"], v.assignments[i].band.as_str());
            assert!(args["output"].is_string() && args["sources"].is_array());
        }
        let sum: f64 = raw.cycles[cycle].node_us.iter().sum();
        assert!((end - sum).abs() <= 1.0 / 32.0, "{end} vs {sum}");
    }
}

#[test]
fn band_tracks_follow_the_rule_set_and_layer_tracks_the_layers() {
    let m = fixture::manifest("profile");
    let raw = fixture::profile_raw();
    let v = ProfileView::new(&m, &raw).unwrap();
    let names = |tracks| -> Vec<String> {
        let doc: Value =
            serde_json::from_slice(&trace_json(&m, &raw, &v.assignments, tracks).unwrap()).unwrap();
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(TraceTracks::Band),
        [
            "attention",
            "linear_attention",
            "projections",
            "moe",
            "other"
        ]
    );
    assert_eq!(
        names(TraceTracks::Layer),
        ["layer 0", "layer 1", "outside layers"]
    );
}

#[test]
fn the_median_cycle_is_the_middle_timed_sum() {
    let mut raw = fixture::profile_raw();
    for (i, c) in raw.cycles.iter_mut().enumerate() {
        let scale = [3.0, 1.0, 5.0, 2.0, 4.0][i];
        c.node_us = vec![scale; 3];
    }
    // TIMED sums 9, 3, 15, 6, 12: the median, 9, is cycle 0
    assert_eq!(median_cycle(&raw), Some(0));
    // an even count takes the lower middle: 3, 6, 9, 15 -> 6, cycle 3
    raw.cycles.pop();
    assert_eq!(median_cycle(&raw), Some(3));
}
