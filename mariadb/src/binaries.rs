//! Locating MariaDB binaries: the project's cache (beside PostgreSQL's,
//! [`scratch_pg::binaries::default_cache_dir`]), else Debian's packages fetched by name
//! with `apt-get download` and unpacked with `dpkg -x`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::MariaError;

/// The Debian packages that hold `mariadbd`, `mariadb-install-db` and `mariadb`.
pub const PACKAGES: [&str; 2] = ["mariadb-server-core", "mariadb-client-core"];

/// The cache folder's name for the unpacked packages (Debian 12 ships MariaDB 10.11).
pub const CACHE_FOLDER: &str = "mariadb-10.11";

/// A folder holding the unpacked packages, and the version `mariadbd --version` printed.
#[derive(Debug, Clone)]
pub struct MariaBinaries {
    /// The unpacked `usr` folder: `sbin/mariadbd`, `bin/mariadb-install-db`,
    /// `bin/mariadb`, `share/mysql` (absolute).
    pub usr: PathBuf,
    /// The full version text, e.g. `mariadbd  Ver 10.11.14-MariaDB-0+deb12u2 …`.
    pub version_text: String,
    /// `cache` or `apt-get download`.
    pub source: &'static str,
}

impl MariaBinaries {
    /// The server program.
    pub fn mariadbd(&self) -> PathBuf {
        self.usr.join("sbin/mariadbd")
    }

    /// A program of the `bin` folder (`mariadb`, `mariadb-install-db`).
    pub fn program(&self, name: &str) -> PathBuf {
        self.usr.join("bin").join(name)
    }
}

/// The binaries from `cache_dir/`[`CACHE_FOLDER`], fetched there first when missing.
/// Concurrent callers are safe: each fetch stages into its own folder and the first
/// atomic rename wins.
///
/// Errors: [`MariaError::Binaries`] when `apt-get` or `dpkg` is missing or fails (the
/// text names the step and its output), or `mariadbd --version` does not run.
pub fn resolve(cache_dir: &Path) -> Result<MariaBinaries, MariaError> {
    let installed = cache_dir.join(CACHE_FOLDER);
    let usr = installed.join("usr");
    if usr.join("sbin/mariadbd").is_file() {
        return inspect(usr, "cache");
    }
    fetch(cache_dir, &installed)?;
    inspect(usr, "apt-get download")
}

fn inspect(usr: PathBuf, source: &'static str) -> Result<MariaBinaries, MariaError> {
    let output = Command::new(usr.join("sbin/mariadbd"))
        .arg("--version")
        .output()
        .map_err(|e| MariaError::Binaries(format!("running mariadbd --version: {e}")))?;
    if !output.status.success() {
        return Err(MariaError::Binaries(format!(
            "mariadbd --version: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(MariaBinaries {
        usr,
        version_text: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        source,
    })
}

/// Downloads [`PACKAGES`] into a staging folder under `cache_dir`, unpacks them, and
/// renames the result to `installed`. Runs `apt-get update` once when a package is not
/// found (a fresh machine's lists may be empty).
fn fetch(cache_dir: &Path, installed: &Path) -> Result<(), MariaError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(MariaError::Binaries(format!(
            "not cached in {} and fetching them needs root (apt-get download {}); run once as root",
            cache_dir.display(),
            PACKAGES.join(" ")
        )));
    }
    fs::create_dir_all(cache_dir)
        .map_err(MariaError::io(format!("creating {}", cache_dir.display())))?;
    let staging = cache_dir.join(format!(".{CACHE_FOLDER}-staging-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(MariaError::io("creating the staging folder"))?;
    let result = download_and_unpack(&staging).and_then(|()| {
        match fs::rename(&staging, installed) {
            Ok(()) => Ok(()),
            // Another process won the race; its copy is as good as ours.
            Err(_) if installed.join("usr/sbin/mariadbd").is_file() => Ok(()),
            Err(e) => Err(MariaError::io(format!(
                "renaming to {}",
                installed.display()
            ))(e)),
        }
    });
    let _ = fs::remove_dir_all(&staging);
    result
}

fn download_and_unpack(staging: &Path) -> Result<(), MariaError> {
    let download = || {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-q", "download"])
            .args(PACKAGES)
            .current_dir(staging)
            .output()
            .map_err(|e| MariaError::Binaries(format!("running apt-get: {e}")))
    };
    let mut output = download()?;
    if !output.status.success() {
        let update = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-q", "update"])
            .output()
            .map_err(|e| MariaError::Binaries(format!("running apt-get update: {e}")))?;
        if !update.status.success() {
            return Err(failed("apt-get update", &update));
        }
        output = download()?;
    }
    if !output.status.success() {
        return Err(failed("apt-get download", &output));
    }
    for entry in fs::read_dir(staging).map_err(MariaError::io("listing the staging folder"))? {
        let path = entry
            .map_err(MariaError::io("listing the staging folder"))?
            .path();
        if path.extension().is_some_and(|ext| ext == "deb") {
            let unpacked = Command::new("dpkg")
                .arg("-x")
                .arg(&path)
                .arg(staging)
                .output()
                .map_err(|e| MariaError::Binaries(format!("running dpkg -x: {e}")))?;
            if !unpacked.status.success() {
                return Err(failed("dpkg -x", &unpacked));
            }
            fs::remove_file(&path).map_err(MariaError::io("removing a fetched package"))?;
        }
    }
    Ok(())
}

fn failed(step: &str, output: &std::process::Output) -> MariaError {
    MariaError::Binaries(format!(
        "{step} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}
