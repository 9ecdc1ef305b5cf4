//! `opledger-candle-trace MODEL.gguf TRACE.json [--tokens N] [--steps S] [--threads T]`
//!
//! Loads a Gemma 3 GGUF with candle-transformers' own quantized model code
//! (`models::quantized_gemma3`, not opledger's forward pass) and runs `S` prefill passes of `N`
//! filler tokens from position 0 (each pass a fresh chunk, as `opledger profile -p N` at depth 0)
//! under the `tracing-chrome` subscriber, as candle's examples do behind `--tracing`. The trace
//! holds the spans candle-transformers itself opens (`model`, `attn`, `attn-mlp`, `qmatmul`,
//! `rms-norm`, `output`, ...); nothing here adds or renames one. The subscriber is installed
//! before the model loads (the model creates its spans then); the first of the `S + 1` passes is
//! a warm-up, which `opledger import --skip-steps 1` leaves out.

use std::fs::File;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_gemma3::ModelWeights;
use tracing_subscriber::prelude::*;

struct Args {
    model: PathBuf,
    trace: PathBuf,
    tokens: usize,
    steps: usize,
    threads: usize,
}

fn args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut pos = Vec::new();
    let (mut tokens, mut steps, mut threads) = (64usize, 3usize, 2usize);
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<usize> {
            let v = it.next().with_context(|| format!("{name} takes a number"))?;
            v.parse().with_context(|| format!("{name}: '{v}' is not a number"))
        };
        match a.as_str() {
            "--tokens" => tokens = num("--tokens")?,
            "--steps" => steps = num("--steps")?,
            "--threads" => threads = num("--threads")?,
            _ => pos.push(PathBuf::from(a)),
        }
    }
    if pos.len() != 2 || tokens == 0 || steps == 0 || threads == 0 {
        bail!("usage: opledger-candle-trace MODEL.gguf TRACE.json [--tokens N] [--steps S] [--threads T]");
    }
    Ok(Args {
        trace: pos.pop().unwrap(),
        model: pos.pop().unwrap(),
        tokens,
        steps,
        threads,
    })
}

fn main() -> Result<()> {
    let a = args()?;
    // candle's CPU kernels size their thread pools from RAYON_NUM_THREADS, once, before any work
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let device = Device::Cpu;
    let mut file =
        File::open(&a.model).with_context(|| format!("{}: cannot open", a.model.display()))?;
    let content = gguf_file::Content::read(&mut file)
        .with_context(|| format!("{}: not a GGUF file candle reads", a.model.display()))?;
    let vocab = content
        .metadata
        .get("gemma3.vocab_size")
        .and_then(|v| v.to_u32().ok())
        .or_else(|| match content.metadata.get("tokenizer.ggml.tokens") {
            Some(gguf_file::Value::Array(t)) => Some(t.len() as u32),
            _ => None,
        })
        .context("no vocabulary size")?;
    // the model creates its spans when it loads: a subscriber installed later never sees them
    let (layer, guard) = tracing_chrome::ChromeLayerBuilder::new()
        .file(&a.trace)
        .build();
    tracing_subscriber::registry().with(layer).init();
    let mut model = ModelWeights::from_gguf(content, &mut file, &device)
        .with_context(|| format!("{}: candle-transformers cannot load it", a.model.display()))?;
    // filler tokens, the same rule for every pass: ids spread over the vocabulary, never 0
    let ids: Vec<u32> = (0..a.tokens as u32)
        .map(|i| 1 + (i * 7919 + 13) % (vocab - 1))
        .collect();
    let input = Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
    // the first pass is a warm-up, traced like the others: `opledger import --skip-steps 1`
    for _ in 0..=a.steps {
        let logits = model.forward(&input, 0)?;
        // the pass is done only when its output is: read it back
        let _ = logits.flatten_all()?.to_vec1::<f32>()?;
    }
    drop(guard);
    eprintln!(
        "{}: a warm-up and {} passes of {} tokens, {} threads",
        a.trace.display(),
        a.steps,
        a.tokens,
        a.threads
    );
    Ok(())
}
