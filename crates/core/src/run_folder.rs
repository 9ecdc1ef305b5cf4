//! Write-once run folders: every measuring command writes one folder, marked incomplete until its
//! last file lands; each file is written under a temporary name and renamed into place.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The marker file present while a folder is being written.
pub const INCOMPLETE_MARKER: &str = "INCOMPLETE";

#[derive(Debug, thiserror::Error)]
pub enum RunFolderError {
    #[error("{}: the run folder already exists (run folders are write-once; choose another -o)", .0.display())]
    Exists(PathBuf),
    #[error("{}: {file} already exists in this run folder (files are written once)", .path.display())]
    FileExists { path: PathBuf, file: String },
    #[error("{}: not a run folder ({why})", .path.display())]
    NotARun { path: PathBuf, why: String },
    #[error("{}: the run is incomplete (interrupted while being written)", .0.display())]
    Incomplete(PathBuf),
    #[error("{}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: schema version {found} is not one this opledger reads (1 to {newest}): written by a newer opledger, or not an opledger file", .path.display())]
    Version {
        path: PathBuf,
        found: String,
        newest: u32,
    },
    #[error("{}: invalid JSON", .path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RunFolderError + '_ {
    move |source| RunFolderError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A run folder being written. A folder this process created and left holding nothing but its
/// marker (the command failed before writing anything, a refusal or an error before measuring)
/// is removed when the value is dropped: a failed command leaves no folder behind, unless the
/// marker says why the run stopped ([`mark_stopped`]).
#[derive(Debug)]
pub struct RunFolder {
    path: PathBuf,
    /// Created by this process (not reopened with [`RunFolder::resume`]).
    created: bool,
}

impl Drop for RunFolder {
    fn drop(&mut self) {
        if !self.created {
            return;
        }
        let only_marker = fs::read_dir(&self.path).is_ok_and(|entries| {
            let names: Vec<_> = entries
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect();
            names.len() == 1 && names[0] == INCOMPLETE_MARKER
        });
        // a marker that says why the run stopped is kept (mark_stopped)
        let stopped = fs::read(self.path.join(INCOMPLETE_MARKER))
            .is_ok_and(|b| b.starts_with(STOPPED.as_bytes()));
        if only_marker && !stopped {
            // best effort: a folder that cannot be removed stays marked incomplete
            let _ = fs::remove_file(self.path.join(INCOMPLETE_MARKER));
            let _ = fs::remove_dir(&self.path);
        }
    }
}

/// How the INCOMPLETE marker of a run that was stopped by a failure starts (the reason follows).
pub const STOPPED: &str = "this run was stopped: ";

/// Writes why the run in `folder` stopped into its INCOMPLETE marker, so the folder stays
/// marked incomplete with the reason and is kept even when it holds nothing else. Returns false
/// (and writes nothing) when the folder has no marker: it was complete before the failure.
pub fn mark_stopped(folder: &Path, why: &str) -> Result<bool, RunFolderError> {
    let marker = folder.join(INCOMPLETE_MARKER);
    if !marker.exists() {
        return Ok(false);
    }
    fs::write(&marker, format!("{STOPPED}{why}\n")).map_err(io_err(&marker))?;
    Ok(true)
}

impl RunFolder {
    /// Creates the folder (its parents too); fails if it exists.
    pub fn create(path: &Path) -> Result<RunFolder, RunFolderError> {
        if path.exists() {
            return Err(RunFolderError::Exists(path.to_path_buf()));
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        // create_dir (not _all) fails if another process created it meanwhile
        fs::create_dir(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                RunFolderError::Exists(path.to_path_buf())
            } else {
                io_err(path)(e)
            }
        })?;
        let folder = RunFolder {
            path: path.to_path_buf(),
            created: true,
        };
        folder.write(INCOMPLETE_MARKER, b"this run folder is being written\n")?;
        Ok(folder)
    }

    /// Reopens a folder whose writing was interrupted (it still carries the marker), to add
    /// what is missing. A finished folder cannot be reopened.
    pub fn resume(path: &Path) -> Result<RunFolder, RunFolderError> {
        if !path.is_dir() {
            return Err(RunFolderError::NotARun {
                path: path.to_path_buf(),
                why: "no such folder".into(),
            });
        }
        if !path.join(INCOMPLETE_MARKER).exists() {
            return Err(RunFolderError::NotARun {
                path: path.to_path_buf(),
                why: "it is complete; a finished run cannot be resumed".into(),
            });
        }
        Ok(RunFolder {
            path: path.to_path_buf(),
            created: false,
        })
    }

    /// Removes a derived file (a rendering) left by an interrupted run, before it is rendered
    /// again from the raw data. Only allowed while the folder is incomplete.
    pub fn remove_derived(&self, name: &str) -> Result<(), RunFolderError> {
        let target = self.path.join(name);
        if target.exists() {
            fs::remove_file(&target).map_err(io_err(&target))?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `name` atomically (temporary file, fsync, rename). Refuses to replace a file.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, RunFolderError> {
        let target = self.path.join(name);
        if target.exists() {
            return Err(RunFolderError::FileExists {
                path: self.path.clone(),
                file: name.to_string(),
            });
        }
        let parent = target.parent().unwrap_or(&self.path);
        fs::create_dir_all(parent).map_err(io_err(parent))?;
        let file_name = target
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{file_name}.tmp"));
        {
            let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
            f.write_all(bytes).map_err(io_err(&tmp))?;
            f.sync_all().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, &target).map_err(io_err(&target))?;
        Ok(target)
    }

    /// Writes `value` as pretty JSON.
    pub fn write_json<T: Serialize>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<PathBuf, RunFolderError> {
        let mut bytes =
            serde_json::to_vec_pretty(value).map_err(|source| RunFolderError::Json {
                path: self.path.join(name),
                source,
            })?;
        bytes.push(b'\n');
        self.write(name, &bytes)
    }

    /// Writes `value` as JSON on one line: raw data, read by machines (a profile's or an
    /// imported trace's `raw.json` holds a figure per node and cycle; indented, it took several
    /// times the bytes and most of an import's writing time).
    pub fn write_json_compact<T: Serialize>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<PathBuf, RunFolderError> {
        let mut bytes = serde_json::to_vec(value).map_err(|source| RunFolderError::Json {
            path: self.path.join(name),
            source,
        })?;
        bytes.push(b'\n');
        self.write(name, &bytes)
    }

    /// Marks the folder complete (removes the marker). Only a finished folder counts as a run.
    pub fn finish(self) -> Result<PathBuf, RunFolderError> {
        let marker = self.path.join(INCOMPLETE_MARKER);
        fs::remove_file(&marker).map_err(io_err(&marker))?;
        Ok(self.path.clone())
    }
}

/// Opens a finished run folder for reading.
pub fn open_complete(path: &Path) -> Result<PathBuf, RunFolderError> {
    if !path.is_dir() {
        return Err(RunFolderError::NotARun {
            path: path.to_path_buf(),
            why: "no such folder".into(),
        });
    }
    if path.join(INCOMPLETE_MARKER).exists() {
        return Err(RunFolderError::Incomplete(path.to_path_buf()));
    }
    Ok(path.to_path_buf())
}

/// Reads and parses a JSON file of a run folder, naming the file on error.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, RunFolderError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&bytes).map_err(|source| RunFolderError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a schema-versioned JSON file of a run folder: its `schema_version` must be a version
/// from 1 to `newest` (the version this opledger writes); a newer or unknown one is refused
/// naming the file. A file without the field (written before it was recorded) is read as
/// version 1.
pub fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    newest: u32,
) -> Result<T, RunFolderError> {
    let value: serde_json::Value = read_json(path)?;
    if let Some(v) = value.get("schema_version") {
        match v.as_u64() {
            Some(n) if (1..=newest as u64).contains(&n) => {}
            _ => {
                return Err(RunFolderError::Version {
                    path: path.to_path_buf(),
                    found: v.to_string(),
                    newest,
                })
            }
        }
    }
    serde_json::from_value(value).map_err(|source| RunFolderError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A fresh folder name under `base`: `<UTC time>-<kind>-<label>`, with `-2`, `-3`, ... appended
/// if that name is taken.
pub fn fresh_run_path(base: &Path, kind: &str, label: &str, utc_stamp: &str) -> PathBuf {
    let clean: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = format!("{utc_stamp}-{kind}-{clean}");
    let mut path = base.join(&stem);
    let mut i = 2;
    while path.exists() {
        path = base.join(format!("{stem}-{i}"));
        i += 1;
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_once_and_marker() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("run1");
        let f = RunFolder::create(&p).unwrap();
        assert!(p.join(INCOMPLETE_MARKER).exists());
        assert!(matches!(
            open_complete(&p),
            Err(RunFolderError::Incomplete(_))
        ));
        f.write("a.txt", b"x").unwrap();
        f.write("sub/b.bin", b"z").unwrap();
        assert_eq!(fs::read(p.join("sub/b.bin")).unwrap(), b"z");
        let err = f.write("a.txt", b"y").unwrap_err();
        assert!(err.to_string().contains("a.txt already exists"), "{err}");
        assert_eq!(fs::read(p.join("a.txt")).unwrap(), b"x");
        f.finish().unwrap();
        assert!(open_complete(&p).is_ok());
        let again = RunFolder::create(&p).unwrap_err();
        assert!(matches!(again, RunFolderError::Exists(_)));
        assert!(again.to_string().contains("run1"));
    }

    #[test]
    fn a_folder_left_with_only_its_marker_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        // created, then the command failed before writing anything
        let p = dir.path().join("refused");
        drop(RunFolder::create(&p).unwrap());
        assert!(!p.exists(), "a refused command left {}", p.display());
        // something was written: the interrupted folder stays, marked incomplete
        let q = dir.path().join("interrupted");
        let f = RunFolder::create(&q).unwrap();
        f.write("manifest.json", b"{}").unwrap();
        drop(f);
        assert!(q.join(INCOMPLETE_MARKER).exists());
        // a reopened folder is never removed, even when it holds only the marker
        let r = dir.path().join("reopened");
        fs::create_dir(&r).unwrap();
        fs::write(r.join(INCOMPLETE_MARKER), b"x").unwrap();
        drop(RunFolder::resume(&r).unwrap());
        assert!(r.join(INCOMPLETE_MARKER).exists());
        // a finished folder stays
        let s = dir.path().join("finished");
        let f = RunFolder::create(&s).unwrap();
        f.write("a.txt", b"x").unwrap();
        f.finish().unwrap();
        assert!(s.join("a.txt").exists());
        // a run stopped by a failure keeps its folder, the marker saying why
        let t = dir.path().join("stopped");
        let f = RunFolder::create(&t).unwrap();
        assert!(mark_stopped(&t, "a remote device failed").unwrap());
        drop(f);
        let why = fs::read_to_string(t.join(INCOMPLETE_MARKER)).unwrap();
        assert_eq!(why, "this run was stopped: a remote device failed\n");
        // a finished folder is not marked
        assert!(!mark_stopped(&s, "late").unwrap());
        assert!(!s.join(INCOMPLETE_MARKER).exists());
    }

    #[test]
    fn a_newer_or_unknown_schema_version_is_refused_naming_the_file() {
        #[derive(serde::Deserialize, Debug)]
        struct V {
            #[allow(dead_code)]
            schema_version: Option<u32>,
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("summary.json");
        fs::write(&p, br#"{"schema_version": 2}"#).unwrap();
        assert!(read_versioned::<V>(&p, 2).is_ok());
        let e = read_versioned::<V>(&p, 1).unwrap_err().to_string();
        assert!(
            e.contains("summary.json") && e.contains("schema version 2") && e.contains("1 to 1"),
            "{e}"
        );
        for bad in [r#"{"schema_version": 0}"#, r#"{"schema_version": "x"}"#] {
            fs::write(&p, bad).unwrap();
            assert!(matches!(
                read_versioned::<V>(&p, 3),
                Err(RunFolderError::Version { .. })
            ));
        }
        // written before the field existed: read as version 1
        fs::write(&p, br#"{}"#).unwrap();
        assert!(read_versioned::<V>(&p, 1).is_ok());
    }

    #[test]
    fn fresh_paths_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let a = fresh_run_path(dir.path(), "profile", "m/x y", "20261201T000000Z");
        assert!(a.ends_with("20261201T000000Z-profile-m_x_y"));
        fs::create_dir(&a).unwrap();
        let b = fresh_run_path(dir.path(), "profile", "m/x y", "20261201T000000Z");
        assert!(b.ends_with("20261201T000000Z-profile-m_x_y-2"));
    }
}
