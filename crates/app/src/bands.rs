//! The band rules a run uses: a file given by the user (which must name the model's
//! architecture), else the built-in set of the architecture; and the user file's keys that
//! match nothing in a captured graph.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use opledger_core::band::BandRules;
use opledger_core::node::NodeInfo;

/// The rules, and the user's file they came from (if any).
#[derive(Debug, Clone)]
pub struct Bands {
    pub rules: BandRules,
    /// The user's file and its own rules, not merged onto what it extends.
    own: Option<(PathBuf, BandRules)>,
}

impl Bands {
    /// The rules of `path` for `arch`, or the built-in ones.
    pub fn load(path: Option<&Path>, arch: &str) -> Result<Bands> {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                let file = p.display().to_string();
                let rules = BandRules::parse(&text, &file)?;
                rules.check_arch(arch, &file)?;
                let own = BandRules::parse_unmerged(&text, &file)?;
                Ok(Bands {
                    rules,
                    own: Some((p.to_path_buf(), own)),
                })
            }
            None => Ok(Bands {
                rules: BandRules::builtin(arch)?,
                own: None,
            }),
        }
    }

    /// Warnings for the keys of the user's file that match no op, weight or node name of
    /// `graph`: most likely typos, which would otherwise show only as a coverage failure after
    /// the measurement. Only the keys the file itself writes are checked, not those of the
    /// generic set it may extend (which names every architecture's tensors), nor the built-in
    /// sets.
    pub fn unmatched(&self, graph: &[NodeInfo]) -> Vec<String> {
        let Some((path, own)) = &self.own else {
            return Vec::new();
        };
        own.unmatched_keys(graph)
            .into_iter()
            .map(|key| {
                format!(
                    "warning: {}: {key} matches no op, weight or node name of this model's graph",
                    path.display()
                )
            })
            .collect()
    }
}
