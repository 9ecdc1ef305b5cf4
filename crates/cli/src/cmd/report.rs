//! `opledger report`: re-render a stored run from its raw data, without measuring again.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use opledger_core::manifest::Manifest;
use opledger_core::profile::ProfileRaw;
use opledger_core::run_folder::{open_complete, read_json, RunFolder};

use super::profile::{exit_code, render_profile};

#[derive(Args)]
pub struct ReportArgs {
    /// The run folder.
    run: PathBuf,
    /// What to print on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write every rendering into this new folder instead.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    Md,
    Csv,
    Json,
    Nodes,
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let dir = open_complete(&args.run)?;
    let m: Manifest = read_json(&dir.join("manifest.json"))?;
    if m.command == "sweep" {
        return sweep_report(&dir, &m, &args);
    }
    if m.command != "profile" {
        bail!(
            "{}: a '{}' run; report renders profile and sweep runs",
            dir.display(),
            m.command
        );
    }
    let raw: ProfileRaw = read_json(&dir.join("raw.json"))?;
    if let Some(out) = &args.output {
        let folder = RunFolder::create(out)?;
        let summary = render_profile(&m, &raw, |name, bytes| {
            folder.write(name, bytes).map(|_| ()).map_err(Into::into)
        })?;
        folder.finish()?;
        return Ok(exit_code(&summary));
    }
    let wanted = match args.format {
        Format::Text => "table.txt",
        Format::Md => "summary.md",
        Format::Csv => "bands.csv",
        Format::Json => "summary.json",
        Format::Nodes => "nodes.csv",
    };
    let mut printed = false;
    let summary = render_profile(&m, &raw, |name, bytes| {
        if name == wanted {
            use std::io::Write;
            std::io::stdout()
                .write_all(bytes)
                .context("writing to stdout")?;
            printed = true;
        }
        Ok(())
    })?;
    debug_assert!(printed);
    Ok(exit_code(&summary))
}

fn sweep_report(dir: &std::path::Path, m: &Manifest, args: &ReportArgs) -> Result<ExitCode> {
    use super::sweep::render_sweep;
    let cfg: opledger_core::sweep::SweepConfig = read_json(&dir.join("config.json"))?;
    if let Some(out) = &args.output {
        let folder = RunFolder::create(out)?;
        render_sweep(dir, m, &cfg, |name, bytes| {
            folder.write(name, bytes).map(|_| ()).map_err(Into::into)
        })?;
        folder.finish()?;
        return Ok(ExitCode::SUCCESS);
    }
    let wanted = match args.format {
        Format::Text => "table.txt",
        Format::Md | Format::Nodes => bail!(
            "a sweep has no {} rendering; try text, csv or json",
            match args.format {
                Format::Md => "markdown",
                _ => "per-node",
            }
        ),
        Format::Csv => "depths.csv",
        Format::Json => "summary.json",
    };
    render_sweep(dir, m, &cfg, |name, bytes| {
        if name == wanted {
            use std::io::Write;
            std::io::stdout()
                .write_all(bytes)
                .context("writing to stdout")?;
        }
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
