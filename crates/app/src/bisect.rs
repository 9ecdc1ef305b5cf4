//! `bisect`: the builds a bisect searches, from a git checkout of llama.cpp (the commits from
//! good to bad along the first parents, each checked out into a worktree of opledger's own:
//! the user's working tree is never touched) or from source trees and archives in order; each
//! built with `scripts/build-worker` (a folder per tree and options, through ccache) and run
//! as a worker process. The search itself is `opledger_core::bisect`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use opledger_core::bisect::{
    run_bisect, BisectConfig, BisectReport, Build, Candidate, Candidates, Described, FolderStore,
};
use opledger_core::engine::{Engine, EngineError, EngineInfo};
use opledger_core::manifest::Manifest;
use opledger_core::run_folder::RunFolder;
use serde::{Deserialize, Serialize};

use crate::bands::Bands;
use crate::engines::{open_engine, EngineKind, EngineSettings, WorkerSettings};
use crate::model::ModelFile;
use crate::ui::Ui;

/// Where the candidates come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Source {
    /// The commits of `repo` from `good` to `bad` (full hashes once resolved).
    Git {
        repo: PathBuf,
        good: String,
        bad: String,
    },
    /// Source trees or `.tar.gz` archives, in order.
    Trees { trees: Vec<PathBuf> },
}

/// How the candidates are built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildSetup {
    /// `scripts/build-worker`.
    pub script: PathBuf,
    /// The CMake options after `--`.
    pub cmake_options: Vec<String>,
    /// opledger's own folder for the worktrees (`<work_dir>/worktrees/<commit>`).
    pub work_dir: PathBuf,
}

/// What a bisect was asked (`request.json`): a resumed bisect reads it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub schema_version: u32,
    pub source: Source,
    pub setup: BuildSetup,
    pub candidates: Vec<Candidate>,
    pub config: BisectConfig,
    pub model: PathBuf,
    pub threads: u32,
}

/// `git -C repo args...`: its stdout, or an error naming the repository and git's words.
fn git(repo: &Path, args: &[&str]) -> Result<String> {
    let o = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .with_context(|| format!("running git in {}", repo.display()))?;
    if !o.status.success() {
        bail!(
            "{}: git {} failed: {}",
            repo.display(),
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The full hash of `rev` in `repo`, refused in words when it names no commit.
fn resolve(repo: &Path, rev: &str, flag: &str) -> Result<String> {
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )
    .map(|s| s.trim().to_string())
    .map_err(|_| anyhow::anyhow!("{flag} {rev}: no such commit in {}", repo.display()))
}

/// The commits from `good` to `bad` in `repo`, oldest first: `good`, then every commit on
/// `bad`'s first-parent line after it (each commit's parent is the one before it).
pub fn git_candidates(repo: &Path, good: &str, bad: &str) -> Result<Vec<Candidate>> {
    if !repo.join(".git").exists() {
        bail!("{}: not a git checkout (no .git)", repo.display());
    }
    let g = resolve(repo, good, "--good")?;
    let b = resolve(repo, bad, "--bad")?;
    if g == b {
        bail!("--good and --bad name the same commit {g}");
    }
    if git(repo, &["merge-base", "--is-ancestor", &g, &b]).is_err() {
        bail!(
            "--good {good} ({g}) is not an ancestor of --bad {bad} ({b}) in {}",
            repo.display()
        );
    }
    let line = |sha: &str| -> Result<Candidate> {
        let subject = git(repo, &["log", "-1", "--format=%s", sha])?;
        Ok(Candidate {
            id: sha.to_string(),
            label: format!("{} {}", &sha[..sha.len().min(10)], subject.trim()),
        })
    };
    let mut out = vec![line(&g)?];
    let list = git(
        repo,
        &[
            "rev-list",
            "--reverse",
            "--first-parent",
            "--ancestry-path",
            &format!("{g}..{b}"),
        ],
    )?;
    for sha in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        out.push(line(sha)?);
    }
    if out.last().map(|c| c.id.as_str()) != Some(b.as_str()) || out.len() < 2 {
        bail!(
            "{}: --bad {bad} is not reached from --good {good} along first parents",
            repo.display()
        );
    }
    Ok(out)
}

/// Source trees and archives in order as candidates: each one's real path, labelled by its name.
pub fn tree_candidates(trees: &[PathBuf]) -> Result<Vec<Candidate>> {
    if trees.len() < 2 {
        bail!(
            "--trees needs at least two trees or archives (the good one first, the bad one last)"
        );
    }
    trees
        .iter()
        .map(|t| {
            let real = std::fs::canonicalize(t)
                .with_context(|| format!("--trees {}: no such file or folder", t.display()))?;
            if real.is_dir() && !real.join("include/llama.h").is_file() {
                bail!(
                    "--trees {}: not a llama.cpp source tree (no include/llama.h)",
                    t.display()
                );
            }
            if real.is_file() && !is_archive(&real) {
                bail!(
                    "--trees {}: neither a folder nor a .tar.gz archive",
                    t.display()
                );
            }
            Ok(Candidate {
                id: real.display().to_string(),
                label: real
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| real.display().to_string()),
            })
        })
        .collect()
}

fn is_archive(p: &Path) -> bool {
    let n = p.to_string_lossy();
    n.ends_with(".tar.gz") || n.ends_with(".tgz")
}

/// The candidates of a bisect, built on demand with `scripts/build-worker` and opened as
/// worker processes.
pub struct Builds<'a> {
    source: Source,
    setup: BuildSetup,
    list: Vec<Candidate>,
    file: &'a ModelFile,
    settings: EngineSettings,
    built: HashMap<usize, (Build, Option<PathBuf>)>,
    /// What each engine said of itself when opened (the ends' for the manifest).
    pub infos: HashMap<usize, EngineInfo>,
}

impl<'a> Builds<'a> {
    pub fn new(
        source: Source,
        setup: BuildSetup,
        list: Vec<Candidate>,
        file: &'a ModelFile,
        settings: EngineSettings,
    ) -> Builds<'a> {
        Builds {
            source,
            setup,
            list,
            file,
            settings,
            built: HashMap::new(),
            infos: HashMap::new(),
        }
    }

    /// The tree to build for candidate `i`: a commit's worktree (added when missing), or the
    /// tree or archive as given.
    fn tree(&self, i: usize) -> Result<(PathBuf, bool)> {
        let c = &self.list[i];
        match &self.source {
            Source::Trees { .. } => {
                let p = PathBuf::from(&c.id);
                let archive = p.is_file();
                Ok((p, archive))
            }
            Source::Git { repo, .. } => {
                let dir = self
                    .setup
                    .work_dir
                    .join("worktrees")
                    .join(&c.id[..c.id.len().min(16)]);
                if dir.join(".git").exists() {
                    let head = git(&dir, &["rev-parse", "HEAD"]).unwrap_or_default();
                    let clean = git(&dir, &["status", "--porcelain", "--untracked-files=no"])
                        .is_ok_and(|s| s.trim().is_empty());
                    if head.trim() == c.id && clean {
                        return Ok((dir, false));
                    }
                    bail!(
                        "{}: a worktree of opledger's that is not at {} or was changed; remove it (git -C {} worktree remove --force {})",
                        dir.display(),
                        c.id,
                        repo.display(),
                        dir.display()
                    );
                }
                std::fs::create_dir_all(self.setup.work_dir.join("worktrees"))
                    .with_context(|| format!("creating {}", self.setup.work_dir.display()))?;
                // a worktree whose folder was removed is still registered: forget it first
                git(repo, &["worktree", "prune"])?;
                let d = dir.display().to_string();
                git(repo, &["worktree", "add", "--detach", &d, &c.id])?;
                Ok((dir, false))
            }
        }
    }

    fn build_now(&self, i: usize) -> Result<(Build, Option<PathBuf>)> {
        if !self.setup.script.is_file() {
            bail!(
                "{}: the worker's build script is not there (--build-worker names scripts/build-worker of an opledger checkout)",
                self.setup.script.display()
            );
        }
        let t0 = Instant::now();
        let (tree, archive) = self.tree(i)?;
        let o = Command::new(&self.setup.script)
            .arg(if archive {
                "--llama-cpp-archive"
            } else {
                "--llama-cpp-dir"
            })
            .arg(&tree)
            .arg("--")
            .args(&self.setup.cmake_options)
            .output()
            .with_context(|| format!("running {}", self.setup.script.display()))?;
        let seconds = t0.elapsed().as_secs_f64();
        if o.status.success() {
            let out = String::from_utf8_lossy(&o.stdout);
            let binary = out.lines().last().map(str::trim).unwrap_or_default();
            if binary.is_empty() || !Path::new(binary).is_file() {
                bail!(
                    "{} built {} but named no worker on its last line",
                    self.setup.script.display(),
                    tree.display()
                );
            }
            Ok((Build::Ready { seconds }, Some(PathBuf::from(binary))))
        } else {
            let err = String::from_utf8_lossy(&o.stderr);
            let lines: Vec<String> = err.lines().map(String::from).collect();
            let tail = lines[lines.len().saturating_sub(20)..].to_vec();
            Ok((
                Build::Failed {
                    seconds,
                    log_tail: tail,
                },
                None,
            ))
        }
    }
}

fn engine_err(e: anyhow::Error) -> EngineError {
    EngineError::Failed(format!("{e:#}"))
}

impl Candidates for Builds<'_> {
    fn candidates(&self) -> &[Candidate] {
        &self.list
    }

    fn build(&mut self, i: usize) -> Result<Build, EngineError> {
        if let Some((b, _)) = self.built.get(&i) {
            // built before in this run: nothing more spent
            return Ok(match b {
                Build::Ready { .. } => Build::Ready { seconds: 0.0 },
                Build::Failed { log_tail, .. } => Build::Failed {
                    seconds: 0.0,
                    log_tail: log_tail.clone(),
                },
            });
        }
        let r = self.build_now(i).map_err(engine_err)?;
        self.built.insert(i, r.clone());
        Ok(r.0)
    }

    fn open(&mut self, i: usize) -> Result<Box<dyn Engine>, EngineError> {
        let Some((_, Some(binary))) = self.built.get(&i) else {
            return Err(EngineError::Failed(format!(
                "{} was not built",
                self.list[i].label
            )));
        };
        let settings = EngineSettings {
            worker: Some(WorkerSettings {
                path: binary.clone(),
                timeout: self
                    .settings
                    .worker
                    .as_ref()
                    .map(|w| w.timeout)
                    .unwrap_or(crate::engines::DEFAULT_WORKER_TIMEOUT),
            }),
            ..self.settings.clone()
        };
        let e = open_engine(EngineKind::LlamaCpp, self.file, &settings).map_err(engine_err)?;
        self.infos.entry(i).or_insert_with(|| e.info());
        Ok(e)
    }

    fn describe(&mut self, i: usize) -> Result<Described, EngineError> {
        match &self.source {
            Source::Trees { .. } => Ok(Described::default()),
            Source::Git { repo, .. } => {
                let id = &self.list[i].id;
                let subject = git(repo, &["log", "-1", "--format=%s", id]).map_err(engine_err)?;
                let files =
                    git(repo, &["show", "--name-only", "--format=", id]).map_err(engine_err)?;
                Ok(Described {
                    subject: Some(subject.trim().to_string()),
                    files: files
                        .lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(String::from)
                        .collect(),
                })
            }
        }
    }
}

/// Runs the bisect `request` asks, storing its ends and steps in `folder` as they end (taking
/// up what a resumed folder holds); progress lines through `ui`. With the manifest's engine
/// record: the ends' workers as they said of themselves.
pub fn bisect(
    request: &Request,
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    folder: &RunFolder,
    ui: &mut dyn Ui,
) -> Result<(BisectReport, EngineInfo)> {
    let mut builds = Builds::new(
        request.source.clone(),
        request.setup.clone(),
        request.candidates.clone(),
        file,
        settings.clone(),
    );
    let mut store = FolderStore { folder };
    let report = run_bisect(
        &mut builds,
        &request.config,
        &bands.rules,
        &file.arch,
        &mut store,
        &mut |line| ui.note(line),
    )?;
    let n = request.candidates.len();
    let sides: Vec<(&str, &EngineInfo)> = [("good", 0), ("bad", n - 1)]
        .into_iter()
        .filter_map(|(side, i)| builds.infos.get(&i).map(|info| (side, info)))
        .collect();
    Ok((report, crate::ab::sides_record(settings, &sides)))
}

/// The manifest of a bisect run.
pub fn manifest(file: &ModelFile, bands: &Bands, engine: EngineInfo) -> Result<Manifest> {
    crate::manifest::manifest("bisect", file, engine, &bands.rules)
}
