//! `opledger synth`: write a synthetic GGUF model from a preset.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_gguf::{presets, synthesize, GgmlType, SynthOptions};

use crate::progress::bytes_bar;

#[derive(Args)]
pub struct SynthArgs {
    /// Preset (real shapes: qwen3.6-35b-a3b, qwen3-30b-a3b, qwen3-8b, llama-3.1-8b; tiny ones
    /// for tests: tiny-qwen35moe, tiny-qwen3moe, tiny-qwen3, tiny-llama). `--list` shows them.
    #[arg(long, default_value = "tiny-qwen35moe")]
    preset: String,
    /// Output file.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Layers (keeps the real pattern of linear- and full-attention layers).
    #[arg(long)]
    layers: Option<u32>,
    /// Routed experts per layer.
    #[arg(long)]
    experts: Option<u32>,
    /// Experts used per token.
    #[arg(long)]
    experts_used: Option<u32>,
    /// Type of the routed-expert weights (Q4_K, Q8_0, F16, F32, ...).
    #[arg(long, default_value = "Q4_K")]
    expert_type: GgmlType,
    /// Type of the other 2-D weights.
    #[arg(long, default_value = "Q8_0")]
    dense_type: GgmlType,
    /// Seed of the weights (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One fused ffn_gate_up_exps tensor instead of separate gate and up (qwen35moe).
    #[arg(long)]
    fused_gate_up: bool,
    /// List the presets and exit.
    #[arg(long)]
    list: bool,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(args: SynthArgs) -> Result<ExitCode> {
    if args.list {
        println!(
            "{:<18} {:<10} {:>7} {:>7}  source",
            "preset", "arch", "layers", "hidden"
        );
        for p in presets() {
            println!(
                "{:<18} {:<10} {:>7} {:>7}  {}",
                p.name,
                p.arch.as_str(),
                p.block_count,
                p.embedding_length,
                p.source
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let opts = SynthOptions {
        preset: args.preset.clone(),
        layers: args.layers,
        experts: args.experts,
        experts_used: args.experts_used,
        expert_type: args.expert_type,
        dense_type: args.dense_type,
        seed: args.seed,
        fused_gate_up: args.fused_gate_up,
        context_length: None,
    };
    let output = args.output.clone().unwrap_or_else(|| {
        let layers = args.layers.map(|l| format!("-{l}l")).unwrap_or_default();
        PathBuf::from(format!("{}{layers}.gguf", args.preset))
    });
    if output.exists() && !args.force {
        bail!("{}: exists (use --force to replace it)", output.display());
    }
    let plan = opledger_gguf::plan(&opts)?;
    let bar = bytes_bar(plan.file_size_bytes(), args.quiet || args.json);
    bar.set_message(format!("writing {}", output.display()));
    let report = synthesize(&opts, &output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("writing {}", output.display()))?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !args.quiet {
        println!(
            "wrote {} ({}, {} layers: {} full-attention, {} linear-attention; {} tensors, {:.1} MB) in {:.1} s",
            report.path.display(),
            report.arch.as_str(),
            report.layers,
            report.full_attention_layers.len(),
            report.linear_attention_layers.len(),
            report.n_tensors,
            report.size_bytes as f64 / 1e6,
            report.write_ms / 1e3
        );
    }
    Ok(ExitCode::SUCCESS)
}
