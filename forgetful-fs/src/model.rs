//! The persistence model of a mount: what a power cut does to unsynced data
//! ([`Model`]) and when a name operation becomes durable ([`Names`]), with the seed
//! that makes a cut's choices reproducible ([`Persistence`]).
//!
//! The choices are a pure function of the cut's seed, the file's path relative to the
//! mount and the block's index ([`Chooser`]): the same dirty blocks cut with the same
//! seed end the same way, whatever order the file system met them in.

use std::fmt;
use std::path::Path;

/// What a power cut does to a file's unsynced blocks (4 KiB pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Model {
    /// Every unsynced block is lost (the page cache is gone, nothing of it was written
    /// back): LazyFS's `clear-cache`. A [`crate::Tear`] can keep a prefix of one write.
    #[default]
    Drop,
    /// Each unsynced block is independently kept or lost, chosen from the cut's seed:
    /// the kernel's write-back and the drive's cache write pages back in an order of
    /// their own, so a later write can be on the disk without an earlier one.
    Reorder,
    /// As [`Model::Reorder`], and a lost block that was overwriting data already on the
    /// disk may instead come back torn (each 512-byte sector new or old) or as garbage
    /// (its sectors random bytes): SQLite's `src/test6.c` crash simulation, for a device
    /// that does not write a sector atomically.
    Garble,
}

/// When a create, mkdir, unlink, rmdir or rename becomes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Names {
    /// At any `fsync` of anything (file or directory): one journal commit takes every
    /// name operation before it, as ext4's journal (`data=ordered`) in practice does.
    #[default]
    Journal,
    /// Only at an `fsync` of the directory holding the name (both directories for a
    /// rename): what POSIX promises, and what Pillai et al. (OSDI 2014) found
    /// applications wrongly relying on beyond.
    Strict,
}

/// A mount's persistence model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Persistence {
    /// What a cut does to unsynced data.
    pub model: Model,
    /// When names become durable.
    pub names: Names,
    /// The seed of the first cut; cut `k` (from 0) uses [`Persistence::cut_seed`].
    pub seed: u64,
    /// Under [`Model::Garble`]: the cut takes the first seed of its sequence (its own,
    /// then [`mix`]es of it) under which at least one unsynced block over old data is
    /// torn or garbled, when one of the first 256 does: for a case that studies what a
    /// garbled block does to an engine, so that every cut has one (forced, not hoped
    /// for). The report's seed is the one taken.
    pub force_garble: bool,
}

impl Persistence {
    /// The seed cut number `cut` (0 first) of this mount uses: the mount's seed for the
    /// first, a mix of it and the number after (so a case that cuts again does not
    /// repeat its choices). A cut can be replayed by mounting with that seed.
    pub fn cut_seed(&self, cut: u64) -> u64 {
        if cut == 0 {
            self.seed
        } else {
            mix(self.seed ^ mix(cut))
        }
    }

    /// Parses `drop`, `reorder` or `garble`, optionally followed by `+strict` or
    /// `+journal` (`reorder+strict`), with `seed`.
    ///
    /// Errors: an unknown word (the message names the known ones).
    pub fn parse(text: &str, seed: u64) -> Result<Persistence, String> {
        let (model, names) = text.split_once('+').unwrap_or((text, "journal"));
        let model = match model {
            "drop" => Model::Drop,
            "reorder" => Model::Reorder,
            "garble" => Model::Garble,
            other => return Err(format!("no model {other:?} (drop, reorder, garble)")),
        };
        let names = match names {
            "journal" => Names::Journal,
            "strict" => Names::Strict,
            other => return Err(format!("no names {other:?} (journal, strict)")),
        };
        Ok(Persistence {
            model,
            names,
            seed,
            force_garble: false,
        })
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Model::Drop => "drop",
            Model::Reorder => "reorder",
            Model::Garble => "garble",
        })
    }
}

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Names::Journal => "journal",
            Names::Strict => "strict",
        })
    }
}

impl fmt::Display for Persistence {
    /// `model=reorder names=strict` (the seed is printed by each cut, as `seed=`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model={} names={}", self.model, self.names)
    }
}

/// What becomes of one unsynced block at a cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Written to the disk whole.
    Kept,
    /// Not written: the disk keeps what it had.
    Lost,
    /// Torn: each 512-byte sector new or old.
    Torn,
    /// Garbage: each 512-byte sector random bytes or old.
    Garbage,
}

/// A sector, the unit a torn or garbled block is made of, in bytes.
pub const SECTOR_BYTES: usize = 512;

/// The cut's choices for one file.
pub struct Chooser {
    file_seed: u64,
    model: Model,
}

impl Chooser {
    /// The choices of a cut with `seed` under `model` for the file at `relative`.
    pub fn new(model: Model, seed: u64, relative: &Path) -> Chooser {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for byte in relative.as_os_str().as_encoded_bytes() {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Chooser {
            file_seed: mix(seed ^ hash),
            model,
        }
    }

    /// A random number for `(index, salt)`.
    pub fn draw(&self, index: u64, salt: u64) -> u64 {
        mix(self.file_seed ^ mix(index.wrapping_mul(0x9e37_79b9) ^ (salt << 48)))
    }

    /// The fate of block `index`; `overwrote` says whether it lies over data the disk
    /// already held (only such a block can be torn or garbled).
    pub fn fate(&self, index: u64, overwrote: bool) -> Fate {
        match self.model {
            Model::Drop => Fate::Lost,
            Model::Reorder => self.kept_or_lost(index),
            Model::Garble => match self.kept_or_lost(index) {
                Fate::Lost if overwrote => match self.draw(index, 2) % 3 {
                    0 => Fate::Lost,
                    1 => Fate::Torn,
                    _ => Fate::Garbage,
                },
                fate => fate,
            },
        }
    }

    fn kept_or_lost(&self, index: u64) -> Fate {
        if self.draw(index, 1) & 1 == 1 {
            Fate::Kept
        } else {
            Fate::Lost
        }
    }

    /// Whether the file's pending truncation reached the disk.
    pub fn truncation_kept(&self) -> bool {
        self.model != Model::Drop && self.draw(u64::MAX, 3) & 1 == 1
    }

    /// Whether sector `sector` of block `index` is the new one (torn, garbled).
    pub fn sector_new(&self, index: u64, sector: u64) -> bool {
        self.draw(index, 4 + sector) & 1 == 1
    }

    /// Garbage bytes for sector `sector` of block `index`.
    pub fn garbage(&self, index: u64, sector: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(SECTOR_BYTES);
        let mut state = self.draw(index, 100 + sector);
        while out.len() < SECTOR_BYTES {
            state = mix(state);
            out.extend_from_slice(&state.to_le_bytes());
        }
        out
    }
}

/// splitmix64's finaliser: a well-mixed 64-bit function of `value`.
pub fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_depend_on_the_seed_and_the_file_alone() {
        let a = Chooser::new(Model::Reorder, 7, Path::new("pg_wal/0001"));
        let b = Chooser::new(Model::Reorder, 7, Path::new("pg_wal/0001"));
        let fates: Vec<Fate> = (0..64).map(|i| a.fate(i, true)).collect();
        assert_eq!(fates, (0..64).map(|i| b.fate(i, true)).collect::<Vec<_>>());
        assert!(fates.contains(&Fate::Kept) && fates.contains(&Fate::Lost));
        let other = Chooser::new(Model::Reorder, 8, Path::new("pg_wal/0001"));
        assert_ne!(
            fates,
            (0..64).map(|i| other.fate(i, true)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn only_garble_tears_and_only_over_old_data() {
        let garble = Chooser::new(Model::Garble, 3, Path::new("f"));
        let fates: Vec<Fate> = (0..200).map(|i| garble.fate(i, true)).collect();
        assert!(fates.contains(&Fate::Torn) && fates.contains(&Fate::Garbage));
        assert!((0..200).all(|i| matches!(garble.fate(i, false), Fate::Kept | Fate::Lost)));
        let drop = Chooser::new(Model::Drop, 3, Path::new("f"));
        assert!((0..200).all(|i| drop.fate(i, true) == Fate::Lost));
    }

    #[test]
    fn parses_the_names_it_prints() {
        let parsed = Persistence::parse("reorder+strict", 5).unwrap();
        assert_eq!(parsed.to_string(), "model=reorder names=strict");
        assert_eq!(
            Persistence::parse("garble", 5).unwrap().names,
            Names::Journal
        );
        assert!(Persistence::parse("shuffle", 5).is_err());
        assert_eq!(parsed.cut_seed(0), 5);
        assert_ne!(parsed.cut_seed(1), 5);
    }
}
