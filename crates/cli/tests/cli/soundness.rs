//! One soundness suite that every engine passes, through the same generic function over
//! `&mut dyn Engine`: the mock engine, llama.cpp and candle, each on a tiny model of an
//! architecture it runs. What any engine must do for the method to hold: a graph in order, a
//! FUSED run without node times, a TIMED run with one finite time per node inside its own wall,
//! the same outputs in every mode, finite logits, and capabilities it says it has and offers.

use std::path::{Path, PathBuf};

use opledger_app::engines::{open_engine, EngineKind, EngineSettings};
use opledger_app::model::ModelFile;
use opledger_core::engine::{Capability, Engine, Mode, Work};
use opledger_gguf::{synthesize, SynthOptions};

fn model(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("{preset}.gguf"));
    synthesize(&SynthOptions::new(preset), &path, &mut |_, _| {}).unwrap();
    path
}

/// Every check of the suite on `engine`, prepared for `work`.
fn sound(engine: &mut dyn Engine, work: &Work) {
    let info = engine.info();
    let name = info.engine.clone();
    assert!(!name.is_empty(), "an engine without a name");
    assert!(info.threads >= 1, "{name}: {} threads", info.threads);

    // what it says it has, it offers; what it offers, it says it has
    let offers = [
        (Capability::Sweep, engine.as_sweep().is_some()),
        (Capability::Replay, engine.as_replay().is_some()),
        (Capability::OpTiming, engine.as_op_timer().is_some()),
        (
            Capability::GraphCapture,
            engine.as_graph_capturer().is_some(),
        ),
    ];
    for (c, offered) in offers {
        assert_eq!(
            engine.supports(c),
            offered,
            "{name}: supports({c:?}) disagrees with what it offers"
        );
        if !offered {
            let e = engine.require(c).unwrap_err().to_string();
            assert!(e.contains(&name), "{name}: refusal without the name: {e}");
        }
    }

    engine.prepare(work).unwrap();
    let graph = engine.graph().unwrap();
    assert!(!graph.is_empty(), "{name}: an empty graph");
    for (i, n) in graph.iter().enumerate() {
        assert_eq!(
            n.index as usize, i,
            "{name}: node {i} carries index {}",
            n.index
        );
        assert!(!n.op.is_empty(), "{name}: node {i} has no op");
    }

    let fused = engine.run(Mode::Fused).unwrap();
    assert!(
        fused.wall_ms.is_finite() && fused.wall_ms > 0.0,
        "{name}: FUSED wall {}",
        fused.wall_ms
    );
    assert!(fused.node_us.is_empty(), "{name}: FUSED timed nodes");

    let observed = engine.run(Mode::FusedObserved).unwrap();
    assert!(
        observed.node_us.is_empty(),
        "{name}: FUSED-observed timed nodes"
    );

    let timed = engine.run(Mode::Timed).unwrap();
    assert_eq!(
        timed.node_us.len(),
        graph.len(),
        "{name}: TIMED times {} nodes of {}",
        timed.node_us.len(),
        graph.len()
    );
    assert!(
        timed.node_us.iter().all(|t| t.is_finite() && *t >= 0.0),
        "{name}: a TIMED node time is negative or not finite"
    );
    let sum_ms: f64 = timed.node_us.iter().sum::<f64>() / 1e3;
    assert!(
        sum_ms <= timed.wall_ms * 1.05 + 0.05,
        "{name}: TIMED nodes sum {sum_ms:.3} ms, more than the run's wall {:.3} ms",
        timed.wall_ms
    );

    // the instrument changes no output
    assert_eq!(
        fused.output_hash, observed.output_hash,
        "{name}: FUSED-observed computed other outputs"
    );
    assert_eq!(
        fused.output_hash, timed.output_hash,
        "{name}: TIMED computed other outputs"
    );
    if engine.supports(Capability::Logits) {
        let logits = engine.logits().unwrap();
        assert_eq!(
            logits.len(),
            1,
            "{name}: a prefill chunk has one logits row"
        );
        assert!(!logits[0].is_empty(), "{name}: an empty logits row");
        assert!(
            logits[0].iter().all(|x| x.is_finite()),
            "{name}: non-finite logits"
        );
    }
}

fn open(kind: EngineKind, path: &Path) -> Box<dyn Engine> {
    let file = if kind.needs_llama_gate() {
        ModelFile::open(path).unwrap()
    } else {
        ModelFile::open_structural(path).unwrap()
    };
    open_engine(kind, &file, &EngineSettings::new(2)).unwrap()
}

#[test]
fn every_engine_passes_the_soundness_suite() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let moe35 = model(dir.path(), "tiny-qwen35moe");
    let moe3 = model(dir.path(), "tiny-qwen3moe");
    let work = Work::prefill(32, 16);
    for (kind, path) in [
        (EngineKind::Mock, &moe35),
        (EngineKind::LlamaCpp, &moe35),
        (EngineKind::LlamaCpp, &moe3),
        (EngineKind::Candle, &moe3),
    ] {
        let mut engine = open(kind, path);
        sound(engine.as_mut(), &work);
    }
}
