//! Every format of every kind of run, rendered from the deterministic fixture and pinned by insta
//! snapshots (tests/snapshots/); rendering twice gives the same bytes.

mod fixture;

use opledger_core::manifest::Manifest;
use opledger_core::profile::ProfileRaw;
use opledger_report::perfetto::TraceTracks;
use opledger_report::render::{available, file_name};
use opledger_report::{
    render, AbView, Format, ProfileView, RenderOptions, RunView, SweepView, WasteView,
};

struct Data {
    profile: (Manifest, ProfileRaw),
    sweep: (
        Manifest,
        opledger_core::sweep::SweepConfig,
        Vec<opledger_core::node::NodeInfo>,
        Vec<opledger_core::sweep::ChunkRecord>,
        Vec<opledger_core::sweep::PassLog>,
    ),
    ab: (Manifest, opledger_core::ab::AbReport),
    waste: (Manifest, ProfileRaw),
}

fn data() -> Data {
    let (cfg, graph, records, passes) = fixture::sweep_data();
    Data {
        profile: (fixture::manifest("profile"), fixture::profile_raw()),
        sweep: (fixture::manifest("sweep"), cfg, graph, records, passes),
        ab: (fixture::manifest("ab"), fixture::ab_report()),
        waste: (fixture::manifest("waste"), fixture::profile_raw()),
    }
}

fn views(d: &Data) -> Vec<RunView<'_>> {
    vec![
        RunView::Profile(ProfileView::new(&d.profile.0, &d.profile.1).unwrap()),
        RunView::Sweep(
            SweepView::new(
                &d.sweep.0, &d.sweep.1, &d.sweep.2, None, &d.sweep.3, &d.sweep.4,
            )
            .unwrap(),
        ),
        RunView::Ab(AbView {
            manifest: &d.ab.0,
            report: &d.ab.1,
        }),
        RunView::Waste(
            WasteView::new(&d.waste.0, &d.waste.1, Some(fixture::WASTE_SOURCE.into())).unwrap(),
        ),
    ]
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).expect("every rendering is UTF-8")
}

#[test]
fn every_format_of_every_run_is_pinned() {
    let d = data();
    let opts = RenderOptions::default();
    let mut rendered = 0;
    for view in views(&d) {
        for format in available(&view) {
            let bytes = render(&view, format, &opts).unwrap();
            let again = render(&view, format, &opts).unwrap();
            assert_eq!(
                bytes,
                again,
                "{} {} differs between renders",
                view.kind(),
                format.name()
            );
            let name = format!("{}_{}", view.kind(), file_name(&view, format).unwrap());
            insta::assert_snapshot!(name, text(bytes));
            rendered += 1;
        }
    }
    // profile 10, sweep 8, ab 7, waste 9
    assert_eq!(rendered, 34);
}

#[test]
fn a_sweep_with_decode_steps_renders_both_phases() {
    let (cfg, graph, records, passes) = fixture::decode_sweep_data();
    let m = fixture::manifest("sweep");
    let view =
        RunView::Sweep(SweepView::new(&m, &cfg, &graph, Some(&graph), &records, &passes).unwrap());
    let opts = RenderOptions::default();
    for format in [
        Format::Text,
        Format::Md,
        Format::Csv,
        Format::Bands,
        Format::Svg,
    ] {
        let out = text(render(&view, format, &opts).unwrap());
        // llama-bench's rows name decode tests `tg4 x2 @ d512`
        assert!(
            out.contains("decode") || out.contains("tg4 x2 @ d512"),
            "{} lacks the decode phase",
            format.name()
        );
        insta::assert_snapshot!(
            format!("sweep_decode_{}", file_name(&view, format).unwrap()),
            out
        );
    }
}

#[test]
fn the_layer_trace_is_pinned() {
    let d = data();
    let view = RunView::Profile(ProfileView::new(&d.profile.0, &d.profile.1).unwrap());
    let opts = RenderOptions {
        trace_tracks: TraceTracks::Layer,
        ..RenderOptions::default()
    };
    insta::assert_snapshot!(
        "profile_trace_layers.json",
        text(render(&view, Format::Perfetto, &opts).unwrap())
    );
}

#[test]
fn a_format_a_run_lacks_is_refused_with_the_list() {
    let d = data();
    let views = views(&d);
    let err = render(&views[1], Format::Perfetto, &RenderOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("a sweep run has no perfetto rendering"),
        "{msg}"
    );
    assert!(msg.contains("html"), "{msg}");
    assert!(render(&views[2], Format::Nodes, &RenderOptions::default()).is_err());
}

#[test]
fn json_carries_its_schema_version() {
    let d = data();
    for view in views(&d) {
        let v: serde_json::Value = serde_json::from_slice(
            &render(&view, Format::Json, &RenderOptions::default()).unwrap(),
        )
        .unwrap();
        // ab.json is at version 4 (a typed verdict, inconclusive scenarios, a control that did
        // not move sets the smallest effect; a control process, bands judged over the cycles,
        // the output gate over every position)
        let expected = if view.kind() == "ab" { 4 } else { 1 };
        assert_eq!(v["schema_version"], expected, "{}", view.kind());
    }
}

#[test]
fn an_ab_report_round_trips_through_json_with_nan_ratios() {
    let r = fixture::ab_report();
    let bytes = serde_json::to_vec_pretty(&r).unwrap();
    let back: opledger_core::ab::AbReport = serde_json::from_slice(&bytes).unwrap();
    assert!(back.scenarios[1]
        .ledger
        .iter()
        .any(|l| l.band == "other" && l.ratio.is_nan()));
    assert_eq!(serde_json::to_vec_pretty(&back).unwrap(), bytes);
}

#[test]
fn the_fixture_profile_passes_the_census_and_coverage() {
    let d = data();
    let v = ProfileView::new(&d.profile.0, &d.profile.1).unwrap();
    assert!(
        v.census.mismatches().is_empty(),
        "{:?}",
        v.census.mismatches()
    );
    assert_eq!(v.summary.coverage, 1.0);
    assert!(v.summary.audit.is_empty());
}

#[test]
fn a_band_stopped_at_zero_by_the_isolation_removal_is_marked_in_every_format_with_bands() {
    // the fixture's first working node calibrated far above its TIMED time: the removal stops
    // it at 0, and each rendering that shows the corrected column says so
    let m = fixture::manifest("profile");
    let mut raw = fixture::profile_raw();
    let n = raw.graph.len();
    let first = raw.graph.iter().position(|g| g.is_working()).unwrap();
    for c in &mut raw.cycles {
        let mut each = vec![0.0; n];
        each[first] = c.node_us[first] + 1.0;
        c.isolation_us = Some(each.iter().sum::<f64>() / n as f64);
        c.isolation_node_us = each;
    }
    let view = RunView::Profile(ProfileView::new(&m, &raw).unwrap());
    let opts = RenderOptions::default();
    for (format, marks) in [
        (Format::Text, &["nodes at 0", "corrected at 0"][..]),
        (Format::Md, &["nodes at 0", "corrected at 0"][..]),
        (Format::Html, &["nodes at 0", "corrected at 0"][..]),
        (
            Format::Json,
            &["\"corrected_clamped_nodes\": 1", "corrected at 0"][..],
        ),
        (Format::Bands, &["corrected_clamped_nodes"][..]),
    ] {
        let out = text(render(&view, format, &opts).unwrap());
        for mark in marks {
            assert!(out.contains(mark), "{} lacks {mark:?}", format.name());
        }
    }
    // the bands CSV: the band's row ends with its one node stopped at 0
    let csv = text(render(&view, Format::Bands, &opts).unwrap());
    assert!(
        csv.lines().skip(1).any(|l| l.ends_with(",1,host")),
        "no band row has a node at 0:\n{csv}"
    );
}

#[test]
fn a_sweep_split_over_rpc_says_its_prefill_shares_are_raw_in_every_format() {
    // the fixture's sweep with its second half of nodes on a remote RPC device: nothing removes
    // their round trips from the prefill shares, and every rendering says so
    let (cfg, mut graph, records, passes) = fixture::sweep_data();
    let half = graph.len() / 2;
    for n in &mut graph[half..] {
        n.device = Some("RPC0[127.0.0.1:50052]".into());
    }
    let m = fixture::manifest("sweep");
    let view = RunView::Sweep(SweepView::new(&m, &cfg, &graph, None, &records, &passes).unwrap());
    let opts = RenderOptions::default();
    let formats = available(&view);
    assert!(formats.len() >= 8, "{formats:?}");
    for format in formats {
        let out = text(render(&view, format, &opts).unwrap());
        assert!(
            out.contains("raw"),
            "the sweep's {} does not say its shares are raw",
            format.name()
        );
    }
    let RunView::Sweep(v) = &view else {
        unreachable!()
    };
    let c = v
        .summary
        .checks
        .iter()
        .find(|c| c.name == "split shares")
        .expect("a split sweep has its split-shares check");
    assert_eq!(c.status, opledger_core::profile::CheckStatus::Warn);
    assert!(v.summary.prefill_raw_split);
    // the same sweep on one machine: no such check, and its renderings do not say raw
    let (cfg, graph, records, passes) = fixture::sweep_data();
    let local = RunView::Sweep(SweepView::new(&m, &cfg, &graph, None, &records, &passes).unwrap());
    let RunView::Sweep(v) = &local else {
        unreachable!()
    };
    assert!(v.summary.checks.iter().all(|c| c.name != "split shares"));
    assert!(!text(render(&local, Format::Text, &opts).unwrap()).contains("raw"));
}

/// A profile read from node records (a FUSED and a TIMED run each, no run with the instrument
/// installed, no noise gate) and an imported trace (one self-traced run): what they did not
/// measure is rendered "not measured" and null in the JSON, never a ratio of a wall to itself.
#[test]
fn figures_a_run_did_not_measure_are_rendered_not_measured() {
    use opledger_core::engine::Mode;
    let d = data();
    let mut raw = d.profile.1.clone();
    for c in &mut raw.cycles {
        c.order = vec![Mode::Fused, Mode::Timed];
        c.fused_observed_ms = c.fused_ms;
    }
    raw.overhead_pairs.clear();
    assert!(!raw.config.gate.enabled);
    let v = ProfileView::new(&d.profile.0, &raw).unwrap();
    let text = opledger_report::profile_text(&d.profile.0, &v.summary);
    assert!(text.contains("instrument overhead not measured"), "{text}");
    assert!(text.contains("overhead not measured\n"), "{text}");
    assert!(text.contains("noise gate: not measured"), "{text}");
    assert!(
        text.contains("WARN overhead") && text.contains("WARN noise"),
        "{text}"
    );
    assert!(!text.contains("1.0000"), "{text}");
    assert!(text.contains("· agreement +"), "{text}");
    let json = text_of(&v, Format::Json);
    let s: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(s["overhead"].is_null(), "{}", s["overhead"]);
    assert!(s["agreement"].is_number());
    let md = text_of(&v, Format::Md);
    assert!(md.contains("instrument overhead not measured"), "{md}");

    // an imported trace: one TIMED run, no calibration (the fixture's graph has idle nodes:
    // the isolation cost stays measured by them)
    for c in &mut raw.cycles {
        c.order = vec![Mode::Timed];
        c.isolation_us = None;
    }
    let v = ProfileView::new(&d.profile.0, &raw).unwrap();
    let text = opledger_report::profile_text(&d.profile.0, &v.summary);
    assert!(
        text.contains("agreement not measured (no FUSED run apart from the TIMED one)"),
        "{text}"
    );
    assert!(
        text.contains("agreement not measured, overhead not measured"),
        "{text}"
    );
    assert!(
        text.contains("agreement after removing it not measured"),
        "{text}"
    );
    let s: serde_json::Value = serde_json::from_str(&text_of(&v, Format::Json)).unwrap();
    for key in ["agreement", "agreement_corrected", "overhead"] {
        assert!(s[key].is_null(), "{key}: {}", s[key]);
    }
}

fn text_of(v: &ProfileView<'_>, format: Format) -> String {
    let view = RunView::Profile(v.clone());
    text(render(&view, format, &RenderOptions::default()).unwrap())
}

/// A run imported without its model or a thread count (node records carry none): every
/// rendering says so, never `0 threads`, a size of 0 bytes, an empty hash or `0 ()` layers.
#[test]
fn an_import_without_model_or_threads_says_not_recorded_in_every_format() {
    let mut m = fixture::manifest("profile");
    m.command = "import".into();
    m.engine.threads = 0;
    m.model.path = "trace.json".into();
    m.model.size_bytes = 0;
    m.model.blake3 = String::new();
    m.model.arch.layers.clear();
    m.model.arch.n_embd = 0;
    let raw = fixture::profile_raw();
    let view = RunView::Profile(ProfileView::new(&m, &raw).unwrap());
    let opts = RenderOptions::default();
    let nr = "not recorded (imported without --model)";
    let txt = text(render(&view, Format::Text, &opts).unwrap());
    assert!(txt.contains("· threads not recorded\n"), "{txt}");
    assert!(txt.contains(&format!("layers: {nr}")), "{txt}");
    let html = text(render(&view, Format::Html, &opts).unwrap());
    for row in ["threads", "file", "size", "BLAKE3", "layers", "embedding"] {
        let want = if row == "threads" { "not recorded" } else { nr };
        assert!(
            html.contains(&format!("<tr><th>{row}</th><td>{want}</td></tr>")),
            "the {row} row"
        );
    }
    assert!(!html.contains("0.00 GiB") && !html.contains("<td>0 ()</td>"));
    assert!(html.contains(&format!("No census: the model was {nr}")));
    let sql = text(render(&view, Format::Sql, &opts).unwrap());
    assert!(
        sql.contains("'trace.json', NULL, NULL, NULL, 'qwen35moe'"),
        "{sql}"
    );
    let md = text(render(&view, Format::Md, &opts).unwrap());
    assert!(
        md.lines().nth(2).unwrap().contains("| not recorded |"),
        "{md}"
    );
}

/// The mock engine with its scripted device clock (every node on one device, each working
/// node's device time exactly its cost, the host's its cost plus the isolation): each band's
/// host-over-device ratio is its (costs + isolation x nodes) over its costs, and its FUSED
/// device time is shared in proportion to its costs; every format with bands carries the
/// device clock.
#[test]
fn a_profile_with_the_device_clock_sets_both_clocks_side_by_side_in_every_format() {
    let m = fixture::manifest("profile");
    let (e, raw) = fixture::device_clock_profile();
    let (costs, iso) = (e.cost_us.clone(), e.isolation_us);
    let v = ProfileView::new(&m, &raw).unwrap();
    let d = v.summary.device_clock.clone().expect("a device clock");
    let working: Vec<usize> = (0..raw.graph.len())
        .filter(|&i| raw.graph[i].is_working())
        .collect();
    assert_eq!(d.nodes_expected as usize, working.len());
    assert_eq!(d.nodes_matched, d.nodes_expected);
    assert!(
        d.fused_unattributed.is_empty(),
        "{:?}",
        d.fused_unattributed
    );
    let assignments = v.assignments.clone();
    let mut per_cost = Vec::new();
    for b in &d.bands {
        let nodes: Vec<usize> = working
            .iter()
            .copied()
            .filter(|&i| assignments[i].band == b.band)
            .collect();
        assert_eq!(b.nodes as usize, nodes.len(), "{}", b.band);
        let c: f64 = nodes.iter().map(|&i| costs[i]).sum();
        let want = (c + iso * nodes.len() as f64) / c;
        assert!(
            (b.timed_ratio - want).abs() < 1e-9,
            "{}: {} against {want}",
            b.band,
            b.timed_ratio
        );
        per_cost.push(b.device_fused_ms_per_token.median / c);
        assert!(
            b.fused_ratio.is_finite() && b.fused_ratio > 0.0,
            "{}",
            b.band
        );
    }
    for p in &per_cost {
        assert!((p / per_cost[0] - 1.0).abs() < 1e-9, "{per_cost:?}");
    }
    let check = v
        .summary
        .checks
        .iter()
        .find(|c| c.name == "device clock")
        .unwrap();
    assert_eq!(
        check.status,
        opledger_core::profile::CheckStatus::Pass,
        "{}",
        check.detail
    );
    let first = &d.bands[0];
    let view = RunView::Profile(v.clone());
    let opts = RenderOptions::default();
    let ratio = format!("{:.2}x", first.timed_ratio);
    for (format, marks) in [
        (
            Format::Text,
            vec!["device clock:", "host / device", ratio.as_str()],
        ),
        (
            Format::Md,
            vec!["### Device clock", "| host / device", ratio.as_str()],
        ),
        (Format::Html, vec!["id=\"device-clock\"", "host / device"]),
        (
            Format::Json,
            vec![
                "\"device_clock\"",
                "\"timed_ratio\"",
                "\"device_fused_ms_per_token\"",
            ],
        ),
        (Format::Bands, vec![",device-timed", ",device-fused"]),
        (
            Format::Sql,
            vec!["opledger_run_device_clock_bands", "host_over_device"],
        ),
    ] {
        let out = text(render(&view, format, &opts).unwrap());
        for mark in marks {
            assert!(
                out.contains(mark),
                "{} lacks {mark:?}:\n{out}",
                format.name()
            );
        }
    }
    // the JSON reads back to the same figures
    let s: opledger_core::profile::ProfileSummary =
        serde_json::from_str(&text(render(&view, Format::Json, &opts).unwrap())).unwrap();
    assert_eq!(s.device_clock.unwrap().bands.len(), d.bands.len());
    // without the clock: none of it
    let plain_raw = fixture::profile_raw();
    let plain = RunView::Profile(ProfileView::new(&m, &plain_raw).unwrap());
    assert!(!text(render(&plain, Format::Text, &opts).unwrap()).contains("device clock"));
}
