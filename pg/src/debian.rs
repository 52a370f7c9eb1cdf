//! Debian packages fetched by name with `apt-get download` and unpacked with `dpkg -x`
//! into a folder of the project's cache ([`crate::binaries::default_cache_dir`]); no
//! `apt-get install` (which would start services). PgBouncer ([`crate::bouncer`]) and the
//! Patroni cluster's programs ([`crate::patroni`]) come this way.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ClusterError;

/// A step on the staging folder after the packages are unpacked.
pub type Finish = dyn Fn(&Path) -> Result<(), ClusterError>;

/// What to fetch into one cache folder.
pub struct Fetch<'a> {
    /// The cache folder's name (`cache_dir/<folder>`).
    pub folder: &'a str,
    /// The Debian packages, by name.
    pub packages: &'a [&'a str],
    /// A file under the folder whose presence means the folder is complete, e.g.
    /// `usr/sbin/pgbouncer`.
    pub probe: &'a str,
    /// A further step on the staging folder before it is renamed into place (Patroni's
    /// virtual environment), or none.
    pub finish: Option<&'a Finish>,
}

/// The folder `cache_dir/<fetch.folder>`, fetched there first when its probe is missing.
/// Concurrent callers are safe: each fetch stages into its own folder and the first
/// rename wins.
///
/// Errors: [`ClusterError::Binaries`] naming the step that failed, or that fetching
/// needs root.
pub fn resolve(cache_dir: &Path, fetch: &Fetch<'_>) -> Result<PathBuf, ClusterError> {
    let installed = cache_dir.join(fetch.folder);
    if installed.join(fetch.probe).is_file() {
        return Ok(installed);
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(ClusterError::Binaries(format!(
            "{} is not cached in {} and fetching it needs root (apt-get download {}); run once as root",
            fetch.folder,
            cache_dir.display(),
            fetch.packages.join(" ")
        )));
    }
    fs::create_dir_all(cache_dir).map_err(ClusterError::io("creating the cache folder"))?;
    let staging = cache_dir.join(format!(".{}-staging-{}", fetch.folder, std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(ClusterError::io("creating the staging folder"))?;
    let result = download_and_unpack(&staging, fetch.packages)
        .and_then(|()| fetch.finish.map_or(Ok(()), |finish| finish(&staging)))
        .and_then(|()| match fs::rename(&staging, &installed) {
            Ok(()) => Ok(()),
            // Another process won the race; its copy is as good as ours.
            Err(_) if installed.join(fetch.probe).is_file() => Ok(()),
            Err(e) => Err(ClusterError::io(format!(
                "renaming to {}",
                installed.display()
            ))(e)),
        });
    let _ = fs::remove_dir_all(&staging);
    result.map(|()| installed)
}

fn download_and_unpack(staging: &Path, packages: &[&str]) -> Result<(), ClusterError> {
    let apt = |verb: &str, packages: &[&str]| {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-q", verb])
            .args(packages)
            .current_dir(staging)
            .output()
            .map_err(|e| ClusterError::Binaries(format!("running apt-get {verb}: {e}")))
    };
    let mut output = apt("download", packages)?;
    if !output.status.success() {
        let update = apt("update", &[])?;
        if !update.status.success() {
            return Err(failed("apt-get update", &update));
        }
        output = apt("download", packages)?;
    }
    if !output.status.success() {
        return Err(failed("apt-get download", &output));
    }
    let entries = fs::read_dir(staging).map_err(ClusterError::io("listing the staging folder"))?;
    for entry in entries {
        let path = entry
            .map_err(ClusterError::io("listing the staging folder"))?
            .path();
        if path.extension().is_some_and(|ext| ext == "deb") {
            let unpacked = Command::new("dpkg")
                .arg("-x")
                .arg(&path)
                .arg(staging)
                .output()
                .map_err(|e| ClusterError::Binaries(format!("running dpkg -x: {e}")))?;
            if !unpacked.status.success() {
                return Err(failed("dpkg -x", &unpacked));
            }
            fs::remove_file(&path).map_err(ClusterError::io("removing a fetched package"))?;
        }
    }
    Ok(())
}

/// A step's failure with its exit status and standard error.
pub(crate) fn failed(step: &str, output: &std::process::Output) -> ClusterError {
    ClusterError::Binaries(format!(
        "{step} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}
