use super::*;
use crate::arch::tests::dense_md;
use crate::mock::MockEngine;

/// An oracle of a history whose first bad candidate is `first_bad`: the search driven by it,
/// candidates in `skip` skipped; the steps taken and where it ended.
fn drive(n: usize, first_bad: usize, skip: &[usize]) -> (Vec<usize>, Found) {
    let mut s = Search::new(n);
    let mut taken = Vec::new();
    while let Some(i) = s.next() {
        taken.push(i);
        assert!(taken.len() <= n, "the search does not end: {taken:?}");
        let d = if skip.contains(&i) {
            Decision::Skipped
        } else if i >= first_bad {
            Decision::Bad
        } else {
            Decision::Good
        };
        s.record(i, d);
    }
    (taken, s.found())
}

#[test]
fn a_first_bad_at_every_place_of_eight_is_found_in_three_steps() {
    for k in 1..8 {
        let (taken, found) = drive(8, k, &[]);
        assert_eq!(
            found,
            Found::FirstBad { index: k },
            "first bad {k}: {taken:?}"
        );
        assert!(taken.len() <= 3, "first bad {k}: {taken:?}");
        // never an end, never twice
        assert!(taken.iter().all(|&i| i > 0 && i < 7), "{taken:?}");
        let mut t = taken.clone();
        t.sort();
        t.dedup();
        assert_eq!(t.len(), taken.len());
    }
    // the first midpoint is the middle (3 of 0..7), then the halves
    assert_eq!(drive(8, 5, &[]).0, vec![3, 5, 4]);
    assert_eq!(drive(8, 1, &[]).0, vec![3, 1]);
}

#[test]
fn a_skipped_candidate_is_stepped_around_as_git_bisect_skip_does() {
    // the middle does not build: its neighbour (the later first) is taken instead
    let (taken, found) = drive(8, 5, &[3]);
    assert_eq!(taken, vec![3, 4, 5]);
    assert_eq!(found, Found::FirstBad { index: 5 });
    // at every place, one skipped candidate costs at most one step more
    for k in 1..8 {
        for skip in 1..7 {
            if skip == k {
                continue;
            }
            let (taken, found) = drive(8, k, &[skip]);
            // the first bad is found unless only the skipped one separates it from a good one
            match found {
                Found::FirstBad { index } => assert_eq!(index, k),
                Found::Range { good, bad, .. } => {
                    assert!(good < k && k <= bad, "{k} in ({good}, {bad}]");
                    assert!(
                        (good + 1..bad).all(|i| i == skip),
                        "{good}..{bad} skip {skip}"
                    );
                }
                other => panic!("{other:?}"),
            }
            assert!(taken.len() <= 4, "first bad {k}, skip {skip}: {taken:?}");
        }
    }
    // the first bad itself skipped: the range of it and the candidate after
    let (_, found) = drive(8, 4, &[4]);
    assert_eq!(
        found,
        Found::Range {
            good: 3,
            bad: 5,
            why: "every candidate between was skipped".into()
        }
    );
}

#[test]
fn an_undecided_step_ends_the_search_with_its_range() {
    let mut s = Search::new(8);
    assert_eq!(s.next(), Some(3));
    s.record(3, Decision::Good);
    assert_eq!(s.next(), Some(5));
    s.record(5, Decision::Undecided);
    assert_eq!(s.next(), None);
    match s.found() {
        Found::Range { good, bad, why } => {
            assert_eq!((good, bad), (3, 7));
            assert!(why.contains("candidate 5 was undecided"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // two candidates: nothing between them, the bad end is the first bad
    assert_eq!(Search::new(2).next(), None);
    assert_eq!(Search::new(2).found(), Found::FirstBad { index: 1 });
}

/// Scripted cycles: `base` x each factor.
fn scripted(base: f64) -> Vec<f64> {
    [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0]
        .iter()
        .map(|f| base * f)
        .collect()
}

#[test]
fn a_step_is_bad_near_bad_good_near_good_and_undecided_between() {
    let (g, b) = (scripted(10.0), scripted(30.0));
    let ends = 3.0;
    let (d, mg, mb, level, bound) = classify(&g, &scripted(30.0), &b, ends, 2000, 1).unwrap();
    assert_eq!(d, Decision::Bad);
    assert!((mg.ratio - 3.0).abs() < 1e-9 && (mb.ratio - 1.0).abs() < 1e-9);
    assert!((level - 0.975).abs() < 1e-12);
    assert!((bound - 3f64.sqrt()).abs() < 1e-12);
    let (d, mg, _, _, _) = classify(&g, &scripted(10.0), &b, ends, 2000, 1).unwrap();
    assert_eq!(d, Decision::Good);
    assert!((mg.ratio - 1.0).abs() < 1e-9);
    // at the geometric middle (sqrt(300)): neither
    let (d, ..) = classify(&g, &scripted(300f64.sqrt()), &b, ends, 2000, 1).unwrap();
    assert_eq!(d, Decision::Undecided);
    // near bad in its median but too noisy for its interval to clear the bound
    let noisy: Vec<f64> = [30.0, 8.0, 31.0, 60.0, 29.0, 12.0, 30.5, 55.0]
        .into_iter()
        .collect();
    let (d, mg, ..) = classify(&g, &noisy, &b, ends, 2000, 1).unwrap();
    assert_eq!(d, Decision::Undecided, "{mg}");
    // a speed-up bisected the same way: bad is faster
    let (d, ..) = classify(&b, &scripted(10.0), &g, 1.0 / 3.0, 2000, 1).unwrap();
    assert_eq!(d, Decision::Bad);
    let (d, ..) = classify(&b, &scripted(30.0), &g, 1.0 / 3.0, 2000, 1).unwrap();
    assert_eq!(d, Decision::Good);
    // no cycle: nothing to classify
    assert!(classify(&[], &[], &[], ends, 100, 1).is_none());
}

fn ends_figure(what: &str, ratio: f64, lo: f64, hi: f64, verdict: Verdict) -> EndsFigure {
    EndsFigure {
        what: what.into(),
        good_ms_per_token: 1.0,
        bad_ms_per_token: ratio,
        bad_good: Interval { ratio, lo, hi },
        control: Interval {
            ratio: 1.0,
            lo: 0.99,
            hi: 1.01,
        },
        verdict,
        good_cycles: Vec::new(),
        bad_cycles: Vec::new(),
        control_cycles: Vec::new(),
    }
}

fn ends(target: EndsFigure, total: EndsFigure) -> Ends {
    Ends {
        schema_version: BISECT_SCHEMA_VERSION,
        cycles: 6,
        outputs_passed: true,
        outputs_refusal: None,
        target,
        total,
        build_seconds: 0.0,
        measure_seconds: 0.0,
    }
}

#[test]
fn ends_that_do_not_differ_are_refused_with_their_figures() {
    let band = Target::Band("attention".into());
    // the band flat, the total moved: said so
    let e = ends(
        ends_figure("band attention", 1.004, 0.98, 1.03, Verdict::WithinNoise),
        ends_figure("the total", 1.4, 1.35, 1.46, Verdict::Slower),
    );
    let why = refusal(&e, &band).unwrap();
    assert!(
        why.starts_with("nothing to bisect: band attention did not move"),
        "{why}"
    );
    assert!(why.contains("1.004 [0.980–1.030]"), "{why}");
    assert!(
        why.contains("while the total did: the total: bad/good 1.400 [1.350–1.460]"),
        "{why}"
    );
    // nothing moved: no word of the total
    let e = ends(
        ends_figure("the total", 1.0, 0.99, 1.01, Verdict::NoChange),
        ends_figure("the total", 1.0, 0.99, 1.01, Verdict::NoChange),
    );
    let why = refusal(&e, &Target::Total).unwrap();
    assert!(why.contains("no change") && !why.contains("while"), "{why}");
    // a control that moved is no ground for a bisect either
    let e = ends(
        ends_figure("band attention", 2.0, 1.9, 2.1, Verdict::Inconclusive),
        ends_figure("the total", 1.4, 1.35, 1.46, Verdict::Inconclusive),
    );
    assert!(refusal(&e, &band).unwrap().contains("inconclusive"));
    // moved: something to bisect
    let e = ends(
        ends_figure("band attention", 2.0, 1.9, 2.1, Verdict::Slower),
        ends_figure("the total", 1.4, 1.35, 1.46, Verdict::Slower),
    );
    assert_eq!(refusal(&e, &band), None);
    // outputs that differ are refused whatever the timing
    let mut e = e;
    e.outputs_passed = false;
    e.outputs_refusal = Some("position 3: NMSE 1e-2".into());
    assert!(refusal(&e, &band).unwrap().contains("position 3"));
}

fn arch() -> ArchInfo {
    ArchInfo::from_metadata(&dense_md("llama", 4)).unwrap()
}

fn rules() -> BandRules {
    BandRules::builtin("llama").unwrap()
}

/// Mock builds in a history: those at or after `first_bad` compute the FFN's GLU `slow` times
/// slower; those in `broken` do not build; those in `wrong` return other logits.
struct MockHistory {
    list: Vec<Candidate>,
    first_bad: usize,
    slow: f64,
    broken: Vec<usize>,
    wrong: Vec<usize>,
    built: Vec<usize>,
    opened: Vec<usize>,
}

impl MockHistory {
    fn new(n: usize, first_bad: usize) -> MockHistory {
        MockHistory {
            list: (0..n)
                .map(|i| Candidate {
                    id: format!("c{i}"),
                    label: format!("c{i} commit {i}"),
                })
                .collect(),
            first_bad,
            slow: 40.0,
            broken: Vec::new(),
            wrong: Vec::new(),
            built: Vec::new(),
            opened: Vec::new(),
        }
    }
}

impl Candidates for MockHistory {
    fn candidates(&self) -> &[Candidate] {
        &self.list
    }
    fn build(&mut self, i: usize) -> Result<Build, EngineError> {
        self.built.push(i);
        Ok(if self.broken.contains(&i) {
            Build::Failed {
                seconds: 1.0,
                log_tail: vec!["ops.cpp:12: error: expected ';'".into()],
            }
        } else {
            Build::Ready { seconds: 2.0 }
        })
    }
    fn open(&mut self, i: usize) -> Result<Box<dyn Engine>, EngineError> {
        self.opened.push(i);
        let mut e = MockEngine::for_arch(&arch());
        // scripted noise of ±3 %, a phase per process
        let noise = [1.0, 1.03, 0.98, 1.01, 0.97, 1.02, 0.99];
        let phase = self.opened.len();
        e.noise = (0..noise.len())
            .map(|k| noise[(k + phase) % noise.len()])
            .collect();
        e.logits = vec![0.25, 1.5, -0.5, 0.75];
        if self.wrong.contains(&i) {
            e.logits = vec![1.5, 0.25, -0.5, 0.75];
        }
        if i >= self.first_bad {
            for (c, n) in e.cost_us.iter_mut().zip(&e.graph) {
                if n.op == "GLU" {
                    *c *= self.slow;
                }
            }
        }
        Ok(Box::new(e))
    }
    fn describe(&mut self, i: usize) -> Result<Described, EngineError> {
        Ok(Described {
            subject: Some(format!("commit {i}")),
            files: vec![format!("file{i}.cpp")],
        })
    }
}

fn config(target: Target) -> BisectConfig {
    BisectConfig {
        work: Work::prefill(16, 0),
        target,
        ends_cycles: 6,
        cycles: 4,
        max_cycles: 8,
        min_effect: 0.05,
        resamples: 2000,
        seed: 7,
        gate: GateConfig {
            enabled: false,
            ..GateConfig::default()
        },
        outputs: OutputGateConfig {
            steps: 2,
            ..Default::default()
        },
    }
}

fn bisect(h: &mut MockHistory, target: Target, store: &mut MemoryStore) -> BisectReport {
    run_bisect(h, &config(target), &rules(), &arch(), store, &mut |_| {}).unwrap()
}

#[test]
fn a_mock_history_is_bisected_to_its_first_bad_build_by_band_with_a_skip() {
    for first_bad in [2, 5, 6] {
        let mut h = MockHistory::new(8, first_bad);
        h.broken = vec![3];
        let mut store = MemoryStore::default();
        let r = bisect(&mut h, Target::Band("dense_ffn".into()), &mut store);
        assert_eq!(
            r.found,
            Found::FirstBad { index: first_bad },
            "{:#?}",
            r.steps
        );
        assert!(r.measured_steps() <= 4, "{:#?}", r.steps);
        assert_eq!(r.ends.target.verdict, Verdict::Slower);
        // the broken build was tried first (the middle) and skipped with its log
        let s0 = &r.steps[0];
        assert_eq!((s0.index, s0.decision), (3, Decision::Skipped));
        assert_eq!(s0.build_log_tail, vec!["ops.cpp:12: error: expected ';'"]);
        assert_eq!(s0.skipped_because.as_deref(), Some("it does not build"));
        // every measured step decided as the history says
        for s in r.steps.iter().filter(|s| s.decision != Decision::Skipped) {
            let expected = if s.index >= first_bad {
                Decision::Bad
            } else {
                Decision::Good
            };
            assert_eq!(s.decision, expected, "{}", s.line());
            assert_eq!(s.cycles, 4);
        }
        // the end: the first bad against its parent, the band table says which band moved
        let fb = r.first_bad.as_ref().unwrap();
        assert_eq!((fb.index, fb.parent), (first_bad, first_bad - 1));
        assert_eq!(
            fb.described.subject.as_deref(),
            Some(&*format!("commit {first_bad}"))
        );
        let top = &fb.scenario.ledger[0];
        assert_eq!(top.band, "dense_ffn");
        assert_eq!(top.judged.as_ref().unwrap().verdict, Verdict::Slower);
        // the store holds what the report says
        assert_eq!(store.steps, r.steps);
        assert_eq!(store.ends.as_ref(), Some(&r.ends));
    }
}

#[test]
fn the_total_and_an_op_are_bisected_too() {
    for target in [Target::Total, Target::Op("glu".into())] {
        let mut h = MockHistory::new(8, 4);
        let r = bisect(&mut h, target.clone(), &mut MemoryStore::default());
        assert_eq!(r.found, Found::FirstBad { index: 4 }, "{target}");
        assert!(r.measured_steps() <= 3);
    }
}

#[test]
fn a_build_whose_output_fails_the_gate_is_skipped() {
    let mut h = MockHistory::new(8, 6);
    h.wrong = vec![3];
    let r = bisect(
        &mut h,
        Target::Band("dense_ffn".into()),
        &mut MemoryStore::default(),
    );
    assert_eq!(r.steps[0].decision, Decision::Skipped);
    let why = r.steps[0].skipped_because.as_deref().unwrap();
    assert!(
        why.starts_with("its output failed the gate against good"),
        "{why}"
    );
    assert_eq!(r.found, Found::FirstBad { index: 6 });
}

#[test]
fn ends_that_do_not_differ_are_refused_before_any_step() {
    // nothing slowed
    let mut h = MockHistory::new(8, 99);
    let r = bisect(
        &mut h,
        Target::Band("dense_ffn".into()),
        &mut MemoryStore::default(),
    );
    match &r.found {
        Found::Refused { why } => assert!(why.starts_with("nothing to bisect"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(r.steps.is_empty() && r.first_bad.is_none());
    assert_eq!(h.built, vec![0, 7]);
    // a band that did not move while the total did
    let mut h = MockHistory::new(8, 4);
    let r = bisect(
        &mut h,
        Target::Band("attention".into()),
        &mut MemoryStore::default(),
    );
    match &r.found {
        Found::Refused { why } => {
            assert!(why.contains("band attention did not move"), "{why}");
            assert!(why.contains("while the total did"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.ends.total.verdict, Verdict::Slower);
    // a band the graph does not hold is an error naming it
    let mut h = MockHistory::new(8, 4);
    let e = run_bisect(
        &mut h,
        &config(Target::Band("moe".into())),
        &rules(),
        &arch(),
        &mut MemoryStore::default(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("band moe is not in the good end's graph"),
        "{e}"
    );
}

#[test]
fn a_killed_bisect_resumes_from_its_stored_steps() {
    let target = Target::Band("dense_ffn".into());
    let mut h = MockHistory::new(8, 6);
    h.broken = vec![3];
    let mut whole = MemoryStore::default();
    let r = bisect(&mut h, target.clone(), &mut whole);
    assert!(r.steps.len() >= 3);
    // killed after its second step: the ends and two steps stored
    let mut partial = MemoryStore {
        ends: whole.ends.clone(),
        steps: whole.steps[..2].to_vec(),
    };
    let mut again = MockHistory::new(8, 6);
    again.broken = vec![3];
    let mut lines = Vec::new();
    let resumed = run_bisect(
        &mut again,
        &config(target),
        &rules(),
        &arch(),
        &mut partial,
        &mut |l| lines.push(l.to_string()),
    )
    .unwrap();
    assert_eq!(resumed.found, r.found);
    assert_eq!(resumed.steps[..2], r.steps[..2]);
    assert_eq!(resumed.steps.len(), r.steps.len());
    // the stored steps were neither built nor measured again
    for s in &r.steps[..2] {
        assert!(!again.built.contains(&s.index), "{} rebuilt", s.index);
    }
    assert!(
        lines[0].contains("resumed") && lines[1].contains("resumed"),
        "{lines:?}"
    );
    // a store of another history is refused
    let mut other = MemoryStore {
        ends: whole.ends.clone(),
        steps: whole.steps.clone(),
    };
    other.steps[0].id = "elsewhere".into();
    let e = run_bisect(
        &mut MockHistory::new(8, 6),
        &config(Target::Band("dense_ffn".into())),
        &rules(),
        &arch(),
        &mut other,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("not this bisect's candidate"), "{e}");
}

#[test]
fn steps_stored_in_a_folder_are_read_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let folder = crate::run_folder::RunFolder::create(&dir.path().join("run")).unwrap();
    let mut h = MockHistory::new(8, 5);
    h.broken = vec![3];
    let mut store = FolderStore { folder: &folder };
    let r = run_bisect(
        &mut h,
        &config(Target::Band("dense_ffn".into())),
        &rules(),
        &arch(),
        &mut store,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(store.steps().unwrap(), r.steps);
    assert_eq!(store.ends().unwrap().as_ref(), Some(&r.ends));
    // a step missing from the sequence is refused naming the file
    std::fs::remove_file(folder.path().join("steps/001.json")).unwrap();
    let e = store.steps().unwrap_err().to_string();
    assert!(
        e.contains("002.json") && e.contains("step 2 where step 1"),
        "{e}"
    );
}
