//! Bisect by band: which of an ordered list of builds (the commits between a good and a bad one
//! in a git history, or source trees in order) first moved one band, the total, or one op.
//!
//! The ends are measured first: good, bad and a second process of good (the control),
//! interleaved; the target's bad/good is judged against the control ([`judge_with_control`]).
//! Ends that do not differ beyond the threshold and the noise are refused: there is nothing to
//! bisect. Each step then measures the midpoint build against both ends in the same cycles
//! (good, mid and bad, the order turning every cycle): mid/good and mid/bad with their
//! intervals, each at the Bonferroni level of the two. The mid is *bad* when it lies from good
//! beyond half the ends' distance (as a log ratio) in bad's direction and within that half of
//! bad; *good* the mirror; else undecided, measured for more cycles up to a bound, then the
//! search ends with the range it narrowed to. A build that fails, or whose output fails the
//! gate against good, is skipped as `git bisect skip` does. Every step is stored as it ends, so
//! a killed bisect resumes from its steps. The search is [`Search`]; the engines and builds come
//! through [`Candidates`] (git commits and builds in `app::bisect`; mocks in the tests).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ab::{
    band_ms, bonferroni, cycle_order, judge_with_control, ratio_ci_at, AbConfig, AbSides,
    ScenarioResult, Tolerance, Verdict,
};
use crate::arch::ArchInfo;
use crate::band::{Assignment, BandRules, Categoriser};
use crate::engine::{Engine, EngineError, Mode, Work};
use crate::node::NodeInfo;
use crate::noise::{Gate, GateConfig};
use crate::outputs::{compare_outputs, OutputGateConfig};
use crate::stats::median;

/// The version of `bisect.json`, `ends.json` and `steps/*.json`.
pub const BISECT_SCHEMA_VERSION: u32 = 1;

/// What a bisect follows: the total, one band, or one op (every node of that op type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Target {
    Total,
    Band(String),
    Op(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Total => write!(f, "the total"),
            Target::Band(b) => write!(f, "band {b}"),
            Target::Op(o) => write!(f, "op {o}"),
        }
    }
}

/// One build of the list: its id (a commit's full hash, a tree's path) and a label (a commit's
/// short hash and subject, a tree's name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub id: String,
    pub label: String,
}

/// A build's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Build {
    /// Built (or found built) in `seconds`.
    Ready { seconds: f64 },
    /// The build failed: the last lines of its log.
    Failed { seconds: f64, log_tail: Vec<String> },
}

/// What a commit says of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Described {
    /// Its subject (`None`: a tree that is not a commit).
    pub subject: Option<String>,
    /// The files it touched (empty for a tree).
    pub files: Vec<String>,
}

/// The builds a bisect searches, in order: the first is the good end, the last the bad one.
pub trait Candidates {
    fn candidates(&self) -> &[Candidate];
    /// Builds candidate `i` (once: later calls answer from the first).
    fn build(&mut self, i: usize) -> Result<Build, EngineError>;
    /// A new engine (a process of its own) on candidate `i`'s build, after a successful build.
    fn open(&mut self, i: usize) -> Result<Box<dyn Engine>, EngineError>;
    /// Its subject and the files it touched.
    fn describe(&mut self, i: usize) -> Result<Described, EngineError>;
}

/// How to bisect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BisectConfig {
    pub work: Work,
    pub target: Target,
    /// Cycles of the ends' measurement (good, bad and the control) and of the final table.
    pub ends_cycles: u32,
    /// Cycles of a step's first measurement, and of each further round while it is undecided.
    pub cycles: u32,
    /// The most cycles a step is measured for before it is called undecided.
    pub max_cycles: u32,
    /// The smallest change of the ends that is something to bisect (0.05 = 5 %).
    pub min_effect: f64,
    pub resamples: u32,
    pub seed: u64,
    pub gate: GateConfig,
    pub outputs: OutputGateConfig,
}

/// A ratio of medians with its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} [{:.3}–{:.3}]", self.ratio, self.lo, self.hi)
    }
}

/// bad/good of one quantity at the ends, against the control (good's second process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndsFigure {
    pub what: String,
    pub good_ms_per_token: f64,
    pub bad_ms_per_token: f64,
    pub bad_good: Interval,
    pub control: Interval,
    pub verdict: Verdict,
    /// Each cycle's ms/token of good, bad and the control.
    pub good_cycles: Vec<f64>,
    pub bad_cycles: Vec<f64>,
    pub control_cycles: Vec<f64>,
}

impl EndsFigure {
    fn words(&self) -> String {
        format!(
            "{}: bad/good {} against the control {} ({} -> {} ms/token): {}",
            self.what,
            self.bad_good,
            self.control,
            fmt_ms(self.good_ms_per_token),
            fmt_ms(self.bad_ms_per_token),
            verdict_words(self.verdict)
        )
    }
}

fn fmt_ms(v: f64) -> String {
    format!("{v:.4}")
}

/// A verdict in a few words.
pub fn verdict_words(v: Verdict) -> &'static str {
    match v {
        Verdict::Faster => "faster",
        Verdict::Slower => "slower",
        Verdict::NoChange => "no change",
        Verdict::WithinNoise => "within the noise",
        Verdict::Inconclusive => "inconclusive (the control moved)",
    }
}

/// The ends measured against each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ends {
    pub schema_version: u32,
    pub cycles: u32,
    /// The output gate of bad against good: passed, or why not.
    pub outputs_passed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_refusal: Option<String>,
    /// The target's figure and the total's (each interval at the Bonferroni level of the two).
    pub target: EndsFigure,
    pub total: EndsFigure,
    pub build_seconds: f64,
    pub measure_seconds: f64,
}

/// Why the ends are nothing to bisect (`None`: they differ beyond the noise).
pub fn refusal(ends: &Ends, target: &Target) -> Option<String> {
    if !ends.outputs_passed {
        return Some(format!(
            "the bad end's output differs from the good end's ({}): a bisect by speed needs the same output at both ends",
            ends.outputs_refusal.as_deref().unwrap_or("the output gate refused it")
        ));
    }
    if ends.target.verdict.moved() {
        return None;
    }
    let mut why = format!(
        "nothing to bisect: {} did not move between the ends beyond the noise; {}",
        target,
        ends.target.words()
    );
    if *target != Target::Total && ends.total.verdict.moved() {
        why.push_str(&format!(
            "; while the total did: {} (bisect the total, or the band that moved)",
            ends.total.words()
        ));
    }
    Some(why)
}

/// A step's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Good,
    Bad,
    /// Not beyond the noise after the most cycles allowed: the search ends with its range.
    Undecided,
    /// Did not build, did not start, or its output failed the gate against good.
    Skipped,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Good => "good",
            Decision::Bad => "bad",
            Decision::Undecided => "undecided",
            Decision::Skipped => "skipped",
        }
    }
}

/// One step: a candidate measured against both ends (or skipped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub schema_version: u32,
    /// 1, 2, ... in the order measured.
    pub number: u32,
    /// The candidate's place in the list.
    pub index: usize,
    pub id: String,
    pub label: String,
    pub decision: Decision,
    /// Why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_because: Option<String>,
    /// A failed build's last log lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub build_log_tail: Vec<String>,
    pub build_seconds: f64,
    pub measure_seconds: f64,
    pub cycles: u32,
    /// mid/good and mid/bad, each at `level`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_good: Option<Interval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_bad: Option<Interval>,
    pub level: f64,
    /// The bounds of the decision: a mid beyond `bound` (in bad's direction) from good is bad,
    /// within it of bad (both ways); the ends' bad/good square-rooted.
    pub bound: f64,
    /// Each cycle's ms/token of the target: good, mid, bad.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub good_cycles: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mid_cycles: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad_cycles: Vec<f64>,
}

impl Step {
    /// The progress line: commit, build time, ratios with intervals, decision.
    pub fn line(&self) -> String {
        let mut s = format!(
            "step {}: {} (build {:.0} s",
            self.number, self.label, self.build_seconds
        );
        if self.measure_seconds > 0.0 {
            s.push_str(&format!(", measured {:.0} s", self.measure_seconds));
        }
        s.push(')');
        if let (Some(g), Some(b)) = (self.mid_good, self.mid_bad) {
            s.push_str(&format!(
                ": mid/good {g}, mid/bad {b} over {} cycles",
                self.cycles
            ));
        }
        s.push_str(&format!(": {}", self.decision.name()));
        if let Some(why) = &self.skipped_because {
            s.push_str(&format!(" ({why})"));
        }
        s
    }
}

/// How the search ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Found {
    /// The ends do not differ beyond the noise (or their outputs differ): nothing bisected.
    Refused { why: String },
    /// The first bad candidate.
    FirstBad { index: usize },
    /// The first bad lies after `good` and at or before `bad` (the candidates between were
    /// skipped, or a step was undecided).
    Range {
        good: usize,
        bad: usize,
        why: String,
    },
}

/// The first bad commit against its parent (the candidate before it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstBad {
    pub index: usize,
    pub parent: usize,
    pub described: Described,
    /// The A/B of the parent (A) against the first bad (B) with a control: the band table and
    /// the op diff.
    pub scenario: ScenarioResult,
    pub build_seconds: f64,
    pub measure_seconds: f64,
}

/// Where the time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WallTime {
    pub build_seconds: f64,
    pub measure_seconds: f64,
    pub total_seconds: f64,
}

/// A bisect's result (`bisect.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BisectReport {
    pub schema_version: u32,
    pub config: BisectConfig,
    pub candidates: Vec<Candidate>,
    pub ends: Ends,
    pub steps: Vec<Step>,
    pub found: Found,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<FirstBad>,
    pub wall: WallTime,
}

impl BisectReport {
    /// Steps that measured (not skipped).
    pub fn measured_steps(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.decision != Decision::Skipped)
            .count()
    }
}

/// The search over candidates 0..n (0 good, n-1 bad) with skips, as `git bisect` does: the
/// next candidate is the middle of the range still open, or the nearest to it not skipped
/// (later first at equal distance); a bad step closes the range's top, a good one its bottom;
/// an undecided step ends the search.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    good: usize,
    bad: usize,
    skipped: BTreeSet<usize>,
    undecided: Option<usize>,
}

impl Search {
    /// A search over `n` candidates (at least 2).
    pub fn new(n: usize) -> Search {
        Search {
            good: 0,
            bad: n.max(2) - 1,
            skipped: BTreeSet::new(),
            undecided: None,
        }
    }

    /// The candidate to measure next; `None` when the search is over.
    pub fn next(&self) -> Option<usize> {
        if self.undecided.is_some() {
            return None;
        }
        let (lo, hi) = (self.good, self.bad);
        if hi <= lo + 1 {
            return None;
        }
        let mid = (lo + hi) / 2;
        let open = |i: usize| i > lo && i < hi && !self.skipped.contains(&i);
        (0..=(hi - lo)).find_map(|d| {
            [mid + d, mid.wrapping_sub(d)]
                .into_iter()
                .find(|&i| i != usize::MAX && open(i))
        })
    }

    pub fn record(&mut self, i: usize, d: Decision) {
        match d {
            Decision::Good => self.good = self.good.max(i),
            Decision::Bad => self.bad = self.bad.min(i),
            Decision::Skipped => {
                self.skipped.insert(i);
            }
            Decision::Undecided => self.undecided = Some(i),
        }
    }

    /// Where the search ended (call when [`Search::next`] is `None`).
    pub fn found(&self) -> Found {
        if let Some(u) = self.undecided {
            return Found::Range {
                good: self.good,
                bad: self.bad,
                why: format!("candidate {u} was undecided after the most cycles allowed"),
            };
        }
        if self.bad == self.good + 1 {
            Found::FirstBad { index: self.bad }
        } else {
            Found::Range {
                good: self.good,
                bad: self.bad,
                why: "every candidate between was skipped".into(),
            }
        }
    }
}

/// Classifies a mid from each cycle's target ms/token of good, mid and bad, given the ends'
/// bad/good: mid/good and mid/bad with their bootstrap intervals at the Bonferroni level of the
/// two; bad when mid/good lies wholly beyond sqrt(bad/good) in bad's direction and mid/bad
/// wholly within it both ways, good the mirror, else undecided. `None` without a cycle.
pub fn classify(
    good: &[f64],
    mid: &[f64],
    bad: &[f64],
    ends_ratio: f64,
    resamples: u32,
    seed: u64,
) -> Option<(Decision, Interval, Interval, f64, f64)> {
    let alpha = bonferroni(0.05, 2);
    let (r, lo, hi) = ratio_ci_at(good, mid, resamples, seed, alpha)?;
    let mid_good = Interval { ratio: r, lo, hi };
    let (r, lo, hi) = ratio_ci_at(bad, mid, resamples, seed ^ 0xB1, alpha)?;
    let mid_bad = Interval { ratio: r, lo, hi };
    let half = ends_ratio.ln() / 2.0;
    let s = half.signum();
    let h = half.abs();
    // the intervals as log ratios, turned so that bad's direction is positive
    let turned = |i: &Interval| {
        let (a, b) = (s * i.lo.ln(), s * i.hi.ln());
        (a.min(b), a.max(b))
    };
    let (g_lo, g_hi) = turned(&mid_good);
    let (b_lo, b_hi) = turned(&mid_bad);
    let within = |lo: f64, hi: f64| lo > -h && hi < h;
    let decision = if h > 0.0 && g_lo > h && within(b_lo, b_hi) {
        Decision::Bad
    } else if h > 0.0 && b_hi < -h && within(g_lo, g_hi) {
        Decision::Good
    } else {
        Decision::Undecided
    };
    Some((decision, mid_good, mid_bad, 1.0 - alpha, h.exp()))
}

/// A store of a bisect's ends and steps, so that a killed bisect resumes.
pub trait BisectStore {
    fn ends(&self) -> Result<Option<Ends>, EngineError>;
    fn store_ends(&mut self, ends: &Ends) -> Result<(), EngineError>;
    fn steps(&self) -> Result<Vec<Step>, EngineError>;
    fn store_step(&mut self, step: &Step) -> Result<(), EngineError>;
}

/// Ends and steps in memory (tests).
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub ends: Option<Ends>,
    pub steps: Vec<Step>,
}

impl BisectStore for MemoryStore {
    fn ends(&self) -> Result<Option<Ends>, EngineError> {
        Ok(self.ends.clone())
    }
    fn store_ends(&mut self, ends: &Ends) -> Result<(), EngineError> {
        self.ends = Some(ends.clone());
        Ok(())
    }
    fn steps(&self) -> Result<Vec<Step>, EngineError> {
        Ok(self.steps.clone())
    }
    fn store_step(&mut self, step: &Step) -> Result<(), EngineError> {
        self.steps.push(step.clone());
        Ok(())
    }
}

/// Ends and steps in a run folder: `ends.json`, `steps/NNN.json`, each written once.
pub struct FolderStore<'f> {
    pub folder: &'f crate::run_folder::RunFolder,
}

fn store_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Failed(e.to_string())
}

impl BisectStore for FolderStore<'_> {
    fn ends(&self) -> Result<Option<Ends>, EngineError> {
        let p = self.folder.path().join("ends.json");
        if !p.exists() {
            return Ok(None);
        }
        crate::run_folder::read_versioned(&p, BISECT_SCHEMA_VERSION)
            .map(Some)
            .map_err(store_err)
    }
    fn store_ends(&mut self, ends: &Ends) -> Result<(), EngineError> {
        self.folder
            .write_json("ends.json", ends)
            .map(|_| ())
            .map_err(store_err)
    }
    fn steps(&self) -> Result<Vec<Step>, EngineError> {
        read_steps(&self.folder.path().join("steps")).map_err(store_err)
    }
    fn store_step(&mut self, step: &Step) -> Result<(), EngineError> {
        self.folder
            .write_json(&format!("steps/{:03}.json", step.number), step)
            .map(|_| ())
            .map_err(store_err)
    }
}

/// The steps stored in `dir` (`NNN.json`), in order; none when it is not there.
pub fn read_steps(dir: &std::path::Path) -> Result<Vec<Step>, crate::run_folder::RunFolderError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| crate::run_folder::RunFolderError::NotARun {
            path: dir.to_path_buf(),
            why: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_stem()
                    .is_some_and(|s| s.to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    names.sort();
    let mut steps: Vec<Step> = Vec::new();
    for p in names {
        let s: Step = crate::run_folder::read_versioned(&p, BISECT_SCHEMA_VERSION)?;
        if s.number as usize != steps.len() + 1 {
            return Err(crate::run_folder::RunFolderError::NotARun {
                path: p,
                why: format!(
                    "step {} where step {} was expected",
                    s.number,
                    steps.len() + 1
                ),
            });
        }
        steps.push(s);
    }
    Ok(steps)
}

/// Each side's runs over the cycles: FUSED walls and TIMED node times.
#[derive(Debug, Default, Clone)]
pub struct SideRuns {
    pub wall_ms: Vec<f64>,
    pub node_us: Vec<Vec<f64>>,
}

/// The order of `n` sides in cycle `p`: [`cycle_order`] for two and three (every side first,
/// second and third equally often), a rotation for more.
fn order(p: u32, n: usize) -> Vec<usize> {
    match n {
        2 => cycle_order(p, false),
        3 => cycle_order(p, true),
        _ => (0..n).map(|i| (i + p as usize) % n).collect(),
    }
}

/// Cycles `from..to` of `engines` (each prepared on the same work): a FUSED run of every side,
/// then a TIMED run of every side, in the cycle's order, every run under the noise gate.
pub fn run_cycles(
    engines: &mut [&mut dyn Engine],
    from: u32,
    to: u32,
    gate: &mut Gate,
    runs: &mut [SideRuns],
) -> Result<(), EngineError> {
    for p in from..to {
        let o = order(p, engines.len());
        for mode in [Mode::Fused, Mode::Timed] {
            for &side in &o {
                let e = &mut *engines[side];
                let (r, _) = gate.run(|| e.run(mode))?;
                if mode == Mode::Fused {
                    runs[side].wall_ms.push(r.wall_ms);
                } else {
                    runs[side].node_us.push(r.node_us);
                }
            }
        }
    }
    Ok(())
}

/// A side's graph, banded.
struct Banded {
    graph: Vec<NodeInfo>,
    cats: Vec<Assignment>,
}

impl Banded {
    fn of(e: &mut dyn Engine, rules: &BandRules, arch: &ArchInfo) -> Result<Banded, EngineError> {
        let graph = e.graph()?;
        let cats = Categoriser::new(rules, arch).categorise(&graph);
        Ok(Banded { graph, cats })
    }
}

/// Each cycle's ms/token of `target` on one side: the total is the FUSED wall / tokens; a band
/// its share of the TIMED node times x that ([`band_ms`]); an op the same share of every node
/// of that op type.
pub fn target_series(
    target: &Target,
    rules: &BandRules,
    cats: &[Assignment],
    graph: &[NodeInfo],
    runs: &SideRuns,
    tokens: u32,
) -> Vec<f64> {
    let per_token = |wall: f64| wall / tokens.max(1) as f64;
    runs.wall_ms
        .iter()
        .zip(&runs.node_us)
        .map(|(&wall, us)| match target {
            Target::Total => per_token(wall),
            Target::Band(b) => {
                let i = rules.bands.iter().position(|x| &x.name == b);
                i.map(|i| band_ms(rules, cats, us, wall, tokens)[i])
                    .unwrap_or(0.0)
            }
            Target::Op(op) => {
                let total: f64 = us.iter().sum();
                let mine: f64 = us
                    .iter()
                    .zip(graph)
                    .filter(|(_, n)| n.op.eq_ignore_ascii_case(op))
                    .map(|(u, _)| u)
                    .sum();
                if total > 0.0 {
                    mine / total * per_token(wall)
                } else {
                    0.0
                }
            }
        })
        .collect()
}

/// Whether `target` is something the graph holds: a band some node is in, an op some node is.
fn target_present(target: &Target, b: &Banded) -> bool {
    match target {
        Target::Total => true,
        Target::Band(name) => b.cats.iter().any(|c| &c.band == name),
        Target::Op(op) => b.graph.iter().any(|n| n.op.eq_ignore_ascii_case(op)),
    }
}

fn med(v: &[f64]) -> f64 {
    median(v).unwrap_or(f64::NAN)
}

fn figure(
    what: String,
    good: Vec<f64>,
    bad: Vec<f64>,
    control: Vec<f64>,
    cfg: &BisectConfig,
    seed: u64,
) -> Result<EndsFigure, EngineError> {
    let alpha = bonferroni(0.05, 2);
    let j = judge_with_control(
        &good,
        &bad,
        &control,
        cfg.resamples,
        seed,
        cfg.min_effect,
        alpha,
    )
    .ok_or_else(|| EngineError::Failed("the ends: no measured cycle".into()))?;
    Ok(EndsFigure {
        what,
        good_ms_per_token: med(&good),
        bad_ms_per_token: med(&bad),
        bad_good: Interval {
            ratio: j.ratio,
            lo: j.lo,
            hi: j.hi,
        },
        control: Interval {
            ratio: j.control_ratio,
            lo: j.control_lo,
            hi: j.control_hi,
        },
        verdict: j.verdict,
        good_cycles: good,
        bad_cycles: bad,
        control_cycles: control,
    })
}

fn failed_build(i: usize, c: &Candidate, b: &Build) -> Option<EngineError> {
    match b {
        Build::Ready { .. } => None,
        Build::Failed { log_tail, .. } => Some(EngineError::Failed(format!(
            "the {} end {} (candidate {i}) does not build; the last lines of its log:\n{}",
            if i == 0 { "good" } else { "bad" },
            c.label,
            log_tail.join("\n")
        ))),
    }
}

fn seconds(b: &Build) -> f64 {
    match b {
        Build::Ready { seconds } | Build::Failed { seconds, .. } => *seconds,
    }
}

/// Runs a bisect over `cands` (at least two: the good end first, the bad end last), storing
/// the ends and every step in `store` as it ends and taking up what `store` already holds;
/// `progress` gets one line per step.
pub fn run_bisect(
    cands: &mut dyn Candidates,
    cfg: &BisectConfig,
    rules: &BandRules,
    arch: &ArchInfo,
    store: &mut dyn BisectStore,
    progress: &mut dyn FnMut(&str),
) -> Result<BisectReport, EngineError> {
    let t0 = std::time::Instant::now();
    let list = cands.candidates().to_vec();
    let n = list.len();
    if n < 2 {
        return Err(EngineError::Failed(format!(
            "a bisect needs a good and a bad end: {n} candidate(s)"
        )));
    }
    if cfg.cycles < 2 || cfg.max_cycles < cfg.cycles || cfg.ends_cycles < 2 {
        return Err(EngineError::Failed(format!(
            "cycles {} (at least 2), up to {} (at least as many), ends {} (at least 2)",
            cfg.cycles, cfg.max_cycles, cfg.ends_cycles
        )));
    }
    let work = &cfg.work;
    let tokens = work.tokens_per_run();
    let mut wall = WallTime::default();

    // the ends, built and opened (their engines serve every step)
    let tb = std::time::Instant::now();
    let (bg, bb) = (cands.build(0)?, cands.build(n - 1)?);
    for (i, b) in [(0, &bg), (n - 1, &bb)] {
        if let Some(e) = failed_build(i, &list[i], b) {
            return Err(e);
        }
    }
    let ends_build = tb.elapsed().as_secs_f64().min(seconds(&bg) + seconds(&bb));
    let mut good = cands.open(0)?;
    let mut bad = cands.open(n - 1)?;
    let threads = good.info().threads.max(bad.info().threads);
    let mut gate = Gate::new(&cfg.gate, threads);
    good.prepare(work)?;
    let g_banded = Banded::of(good.as_mut(), rules, arch)?;
    if !target_present(&cfg.target, &g_banded) {
        return Err(EngineError::Failed(format!(
            "{} is not in the good end's graph ({} nodes)",
            cfg.target,
            g_banded.graph.len()
        )));
    }
    bad.prepare(work)?;
    let b_banded = Banded::of(bad.as_mut(), rules, arch)?;
    let ends = match store.ends()? {
        Some(e) => {
            progress("the ends: measured before (resumed)");
            e
        }
        None => {
            let tm = std::time::Instant::now();
            let (gate_out, _) = compare_outputs(
                good.output_reader()?,
                bad.output_reader()?,
                work,
                &cfg.outputs,
            )?;
            let mut control = cands.open(0)?;
            for e in [&mut good, &mut bad, &mut control] {
                e.prepare(work)?;
            }
            let mut runs = vec![SideRuns::default(); 3];
            {
                let mut engines: [&mut dyn Engine; 3] =
                    [good.as_mut(), bad.as_mut(), control.as_mut()];
                run_cycles(&mut engines, 0, cfg.ends_cycles, &mut gate, &mut runs)?;
            }
            drop(control);
            let series = |t: &Target, side: usize, b: &Banded| {
                target_series(t, rules, &b.cats, &b.graph, &runs[side], tokens)
            };
            let target = figure(
                cfg.target.to_string(),
                series(&cfg.target, 0, &g_banded),
                series(&cfg.target, 1, &b_banded),
                series(&cfg.target, 2, &g_banded),
                cfg,
                cfg.seed,
            )?;
            let total = figure(
                Target::Total.to_string(),
                series(&Target::Total, 0, &g_banded),
                series(&Target::Total, 1, &b_banded),
                series(&Target::Total, 2, &g_banded),
                cfg,
                cfg.seed ^ 0x7074,
            )?;
            let ends = Ends {
                schema_version: BISECT_SCHEMA_VERSION,
                cycles: cfg.ends_cycles,
                outputs_passed: gate_out.passed,
                outputs_refusal: gate_out.refusal(),
                target,
                total,
                build_seconds: ends_build,
                measure_seconds: tm.elapsed().as_secs_f64(),
            };
            store.store_ends(&ends)?;
            progress(&format!(
                "the ends: {} (good) against {} (bad): {}",
                list[0].label,
                list[n - 1].label,
                ends.target.words()
            ));
            ends
        }
    };
    wall.build_seconds += ends.build_seconds;
    wall.measure_seconds += ends.measure_seconds;
    let report = |steps, found, first_bad, mut wall: WallTime, ends: Ends| {
        wall.total_seconds = t0.elapsed().as_secs_f64();
        BisectReport {
            schema_version: BISECT_SCHEMA_VERSION,
            config: cfg.clone(),
            candidates: list.clone(),
            ends,
            steps,
            found,
            first_bad,
            wall,
        }
    };
    if let Some(why) = refusal(&ends, &cfg.target) {
        return Ok(report(Vec::new(), Found::Refused { why }, None, wall, ends));
    }
    let ends_ratio = ends.target.bad_good.ratio;

    // the search, taking up the stored steps
    let mut search = Search::new(n);
    let mut steps = store.steps()?;
    for s in &steps {
        if s.index >= n || list[s.index].id != s.id {
            return Err(EngineError::Failed(format!(
                "stored step {} names {} at place {}, which is not this bisect's candidate there",
                s.number, s.id, s.index
            )));
        }
        search.record(s.index, s.decision);
        wall.build_seconds += s.build_seconds;
        wall.measure_seconds += s.measure_seconds;
        progress(&format!("{} (resumed)", s.line()));
    }
    while let Some(i) = search.next() {
        let number = steps.len() as u32 + 1;
        let mut step = Step {
            schema_version: BISECT_SCHEMA_VERSION,
            number,
            index: i,
            id: list[i].id.clone(),
            label: list[i].label.clone(),
            decision: Decision::Skipped,
            skipped_because: None,
            build_log_tail: Vec::new(),
            build_seconds: 0.0,
            measure_seconds: 0.0,
            cycles: 0,
            mid_good: None,
            mid_bad: None,
            level: 1.0 - bonferroni(0.05, 2),
            bound: (ends_ratio.ln().abs() / 2.0).exp(),
            good_cycles: Vec::new(),
            mid_cycles: Vec::new(),
            bad_cycles: Vec::new(),
        };
        let built = cands.build(i)?;
        step.build_seconds = seconds(&built);
        if let Build::Failed { log_tail, .. } = built {
            step.skipped_because = Some("it does not build".into());
            step.build_log_tail = log_tail;
        } else {
            let tm = std::time::Instant::now();
            measure_step(
                &mut step,
                cands,
                good.as_mut(),
                bad.as_mut(),
                &g_banded,
                &b_banded,
                ends_ratio,
                cfg,
                rules,
                arch,
                &mut gate,
            )?;
            step.measure_seconds = tm.elapsed().as_secs_f64();
        }
        store.store_step(&step)?;
        progress(&step.line());
        search.record(i, step.decision);
        wall.build_seconds += step.build_seconds;
        wall.measure_seconds += step.measure_seconds;
        steps.push(step);
    }
    drop(good);
    drop(bad);
    let found = search.found();
    let first_bad = match found {
        Found::FirstBad { index } => {
            let parent = index - 1;
            let tm = std::time::Instant::now();
            let (bp, bi) = (cands.build(parent)?, cands.build(index)?);
            let mut a = cands.open(parent)?;
            let mut b = cands.open(index)?;
            let mut c = cands.open(parent)?;
            let ab = AbConfig {
                scenarios: vec![work.clone()],
                pairs: cfg.ends_cycles,
                gate: cfg.gate,
                tolerance: Tolerance::default(),
                min_effect: cfg.min_effect,
                resamples: cfg.resamples,
                seed: cfg.seed ^ 0xF1B,
                outputs: Some(cfg.outputs),
            };
            let mut r = crate::ab::run_ab(
                AbSides {
                    a: a.as_mut(),
                    b: b.as_mut(),
                    control: Some(c.as_mut()),
                },
                &ab,
                rules,
                arch,
                &mut |_, _, _| {},
            )?;
            let described = cands.describe(index)?;
            let measure_seconds = tm.elapsed().as_secs_f64();
            wall.measure_seconds += measure_seconds;
            progress(&format!(
                "first bad: {} against its parent {}: B/A {:.3} [{:.3}–{:.3}]",
                list[index].label, list[parent].label, r[0].ratio, r[0].ratio_lo, r[0].ratio_hi
            ));
            // (both were built by the search: a build found ready costs nothing here)
            let _ = (bp, bi);
            Some(FirstBad {
                index,
                parent,
                described,
                scenario: r.remove(0),
                build_seconds: 0.0,
                measure_seconds,
            })
        }
        _ => None,
    };
    Ok(report(steps, found, first_bad, wall, ends))
}

/// One step's measurement: the output gate of mid against good (a refusal skips it), then
/// cycles of good, mid and bad until the mid is classified or `cfg.max_cycles` were run.
#[allow(clippy::too_many_arguments)]
fn measure_step(
    step: &mut Step,
    cands: &mut dyn Candidates,
    good: &mut dyn Engine,
    bad: &mut dyn Engine,
    g_banded: &Banded,
    b_banded: &Banded,
    ends_ratio: f64,
    cfg: &BisectConfig,
    rules: &BandRules,
    arch: &ArchInfo,
    gate: &mut Gate,
) -> Result<(), EngineError> {
    let work = &cfg.work;
    let mut mid = match cands.open(step.index) {
        Ok(m) => m,
        Err(e) => {
            step.skipped_because = Some(format!("its worker did not start: {e}"));
            return Ok(());
        }
    };
    let (out, _) = compare_outputs(
        good.output_reader()?,
        mid.output_reader()?,
        work,
        &cfg.outputs,
    )?;
    if let Some(why) = out.refusal() {
        step.skipped_because = Some(format!("its output failed the gate against good: {why}"));
        return Ok(());
    }
    good.prepare(work)?;
    bad.prepare(work)?;
    mid.prepare(work)?;
    let m_banded = Banded::of(mid.as_mut(), rules, arch)?;
    let mut runs = vec![SideRuns::default(); 3];
    let mut done = 0;
    let tokens = work.tokens_per_run();
    loop {
        let to = (done + cfg.cycles).min(cfg.max_cycles);
        {
            let mut engines: [&mut dyn Engine; 3] = [&mut *good, mid.as_mut(), &mut *bad];
            run_cycles(&mut engines, done, to, gate, &mut runs)?;
        }
        done = to;
        let s = |side: usize, b: &Banded| {
            target_series(&cfg.target, rules, &b.cats, &b.graph, &runs[side], tokens)
        };
        let (g, m, b) = (s(0, g_banded), s(1, &m_banded), s(2, b_banded));
        let seed = cfg.seed ^ ((step.number as u64) << 16) ^ done as u64;
        let (d, mg, mb, level, bound) = classify(&g, &m, &b, ends_ratio, cfg.resamples, seed)
            .ok_or_else(|| EngineError::Failed("a step without a measured cycle".into()))?;
        step.decision = d;
        step.mid_good = Some(mg);
        step.mid_bad = Some(mb);
        step.level = level;
        step.bound = bound;
        step.cycles = done;
        step.good_cycles = g;
        step.mid_cycles = m;
        step.bad_cycles = b;
        if d != Decision::Undecided || done >= cfg.max_cycles {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests;
