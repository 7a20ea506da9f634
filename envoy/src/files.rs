//! Where the resources live on disk, the one definition of the layout Envoy's bootstrap watches
//! (`CDS_DIR`/`ECDS_DIR`), and how they are replaced.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `cds/cds.json` (with `cds/rds.json` beside it), `ecds/ecds.json` and `eds/` under one directory: the
/// clusters and the table in directories of their own, because Envoy watches the directory and
/// reloads on a rename into it (a rename of `rds.json` has Envoy read `cds.json` again too,
/// unchanged, which costs nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    pub dir: PathBuf,
}

impl Files {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn cds_dir(&self) -> PathBuf {
        self.dir.join("cds")
    }

    pub fn ecds_dir(&self) -> PathBuf {
        self.dir.join("ecds")
    }

    /// The apiservers' endpoints, one file per cluster ([`crate::eds`]): `cds.json` names each
    /// file, and Envoy watches each on its own, so no bootstrap names this directory.
    pub fn eds_dir(&self) -> PathBuf {
        self.dir.join("eds")
    }

    pub fn cds_path(&self) -> PathBuf {
        self.cds_dir().join("cds.json")
    }

    /// The routes: which requests skip the filter depends on the table.
    pub fn rds_path(&self) -> PathBuf {
        self.cds_dir().join("rds.json")
    }

    pub fn ecds_path(&self) -> PathBuf {
        self.ecds_dir().join("ecds.json")
    }

    /// The native module's ECDS file (docs/native-module.md).
    pub fn module_ecds_path(&self) -> PathBuf {
        module_ecds_path(&self.ecds_dir())
    }

    /// `cds.json` with every cluster's endpoints inline again (from its file under `eds/`): the
    /// form [`crate::resources`] writes and reads.
    pub fn read_clusters(&self) -> std::io::Result<Value> {
        let read = |p: &Path| -> std::io::Result<Value> {
            serde_json::from_slice(&std::fs::read(p)?).map_err(std::io::Error::other)
        };
        Ok(crate::eds::join(&read(&self.cds_path())?, |p| read(p).ok()))
    }

    /// The three files at once, in push order, without waiting on Envoy: for a first table,
    /// before any Envoy watches them (a running Envoy gets its tables through the sidecar's pusher, which waits on Envoy between them).
    pub fn write_first(&self, cds: &Value, rds: &Value, ecds: &Value) -> std::io::Result<()> {
        std::fs::create_dir_all(self.cds_dir())?;
        std::fs::create_dir_all(self.ecds_dir())?;
        write_atomic(&self.cds_path(), cds.to_string().as_bytes())?;
        write_atomic(&self.rds_path(), rds.to_string().as_bytes())?;
        write_atomic(&self.ecds_path(), ecds.to_string().as_bytes())
    }
}

/// The native module's ECDS file under the filter's ECDS directory: a directory of its own
/// (Envoy watches each file's directory), which a bootstrap may name through a placeholder.
pub fn module_ecds_path(ecds_dir: &Path) -> PathBuf {
    ecds_dir.join("module/ecds.json")
}

/// Replaces `path` so that a watcher sees either the old or the new content, never a mix: Envoy
/// reloads a watched directory on rename.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
