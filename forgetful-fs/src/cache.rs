//! One file's unsynced data: the pages written since its last `fsync`, held in memory
//! the way the operating system's page cache holds dirty pages, with the logical size
//! they give the file. Reads see them; an `fsync` writes them to the backing file; a
//! power cut forgets them (or keeps a torn prefix of the last write).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::model::{Chooser, Fate, SECTOR_BYTES};

/// Size of a cached page in bytes (the page size of Linux on x86-64).
pub const PAGE_BYTES: u64 = 4096;

/// The dirty pages of one file and what was written to them since the last sync.
#[derive(Debug)]
pub struct Dirty {
    /// Page index → the page's whole content (PAGE_BYTES long).
    pages: BTreeMap<u64, Vec<u8>>,
    /// The file's size as readers see it.
    pub len: u64,
    /// The smallest size the file was truncated to since the last sync (the backing
    /// file's size when it was not): backing bytes at or past it read as zeros.
    low_water: u64,
    /// The backing file's size when this data began: a block below it overwrites
    /// what the disk held (only such a block can be torn or garbled at a cut).
    base_len: u64,
    /// Write (and truncate) operations since the last sync.
    pub operations: u64,
    /// Bytes passed to `write` since the last sync.
    pub bytes: u64,
    /// Offset and length of the last write, for a tear.
    pub last_write: Option<(u64, u64)>,
}

impl Dirty {
    /// Nothing dirty yet on a backing file of `backing_len` bytes.
    pub fn new(backing_len: u64) -> Dirty {
        Dirty {
            pages: BTreeMap::new(),
            len: backing_len,
            low_water: backing_len,
            base_len: backing_len,
            operations: 0,
            bytes: 0,
            last_write: None,
        }
    }

    /// The page `index` as readers see it: dirty, else the backing file's (zeros past
    /// its end or past a truncation).
    fn page(&self, backing: &File, index: u64) -> io::Result<Vec<u8>> {
        if let Some(page) = self.pages.get(&index) {
            return Ok(page.clone());
        }
        let mut page = vec![0u8; PAGE_BYTES as usize];
        let start = index * PAGE_BYTES;
        if start < self.low_water {
            let want = (self.low_water - start).min(PAGE_BYTES) as usize;
            read_fully(backing, &mut page[..want], start)?;
        }
        Ok(page)
    }

    /// Records a write of `data` at `offset` (reading partial pages in from `backing`).
    ///
    /// Errors: reading the backing file.
    pub fn write(&mut self, backing: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let mut position = offset;
        while position < end {
            let index = position / PAGE_BYTES;
            let mut page = self.page(backing, index)?;
            let in_page = (position % PAGE_BYTES) as usize;
            let take = ((PAGE_BYTES as usize) - in_page).min((end - position) as usize);
            let from = (position - offset) as usize;
            page[in_page..in_page + take].copy_from_slice(&data[from..from + take]);
            self.pages.insert(index, page);
            position += take as u64;
        }
        self.len = self.len.max(end);
        self.operations += 1;
        self.bytes += data.len() as u64;
        self.last_write = Some((offset, data.len() as u64));
        Ok(())
    }

    /// Records a truncation (or extension) to `size` bytes.
    pub fn truncate(&mut self, size: u64) {
        if size < self.len {
            let first_gone = size.div_ceil(PAGE_BYTES);
            self.pages.retain(|index, _| *index < first_gone);
            if let Some(page) = self.pages.get_mut(&(size / PAGE_BYTES)) {
                page[(size % PAGE_BYTES) as usize..].fill(0);
            }
            self.low_water = self.low_water.min(size);
        }
        self.len = size;
        self.operations += 1;
        self.last_write = None;
    }

    /// Reads up to `size` bytes at `offset` as readers see them.
    ///
    /// Errors: reading the backing file.
    pub fn read(&self, backing: &File, offset: u64, size: u64) -> io::Result<Vec<u8>> {
        let end = (offset + size).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut position = offset;
        while position < end {
            let index = position / PAGE_BYTES;
            let page = self.page(backing, index)?;
            let in_page = (position % PAGE_BYTES) as usize;
            let take = ((PAGE_BYTES as usize) - in_page).min((end - position) as usize);
            out.extend_from_slice(&page[in_page..in_page + take]);
            position += take as u64;
        }
        Ok(out)
    }

    /// Writes everything to `backing` (what an `fsync` makes durable).
    ///
    /// Errors: writing the backing file.
    pub fn flush_to(&self, backing: &File) -> io::Result<()> {
        if self.low_water < backing.metadata()?.len() {
            backing.set_len(self.low_water)?;
        }
        for (index, page) in &self.pages {
            let start = index * PAGE_BYTES;
            if start >= self.len {
                continue;
            }
            let keep = (self.len - start).min(PAGE_BYTES) as usize;
            backing.write_all_at(&page[..keep], start)?;
        }
        backing.set_len(self.len)
    }

    /// At a power cut with a tear at `boundary_bytes`: the part of the last write up to
    /// the first boundary inside it, written to `backing`; the rest is lost. Returns the
    /// bytes kept (0 when the last write fits within one boundary, or there is none).
    ///
    /// Errors: writing the backing file.
    pub fn tear_last_write(&self, backing: &File, boundary_bytes: u64) -> io::Result<u64> {
        let Some((offset, length)) = self.last_write else {
            return Ok(0);
        };
        let cut_at = (offset / boundary_bytes + 1) * boundary_bytes;
        if cut_at >= offset + length {
            return Ok(0);
        }
        let kept = self.read(backing, offset, cut_at - offset)?;
        backing.write_all_at(&kept, offset)?;
        Ok(kept.len() as u64)
    }
}

/// What a cut under a model did to one file's unsynced blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounts {
    /// Blocks written to the disk whole.
    pub kept: u64,
    /// Blocks not written.
    pub lost: u64,
    /// Blocks written in part: some sectors new, the others old.
    pub torn: u64,
    /// Blocks with sectors of garbage.
    pub garbled: u64,
}

impl Dirty {
    /// Whether a cut with `chooser` would tear or garble at least one block over what a
    /// backing file of `disk_len` bytes holds (a dry run of [`Dirty::cut_with`]).
    pub fn would_garble(&self, disk_len: u64, chooser: &Chooser) -> bool {
        self.pages.keys().any(|index| {
            let start = index * PAGE_BYTES;
            let overwrote = start < self.len && start < disk_len.min(self.base_len);
            overwrote && matches!(chooser.fate(*index, true), Fate::Torn | Fate::Garbage)
        })
    }

    /// At a power cut under a model: the pending truncation reaches the disk or not,
    /// then each dirty block is written whole, left out, torn or garbled as `chooser`
    /// says ([`Chooser::fate`]). The file's size on the disk grows only as far as kept
    /// blocks reach (never past the size readers saw).
    ///
    /// Errors: writing the backing file.
    pub fn cut_with(&self, backing: &File, chooser: &Chooser) -> io::Result<BlockCounts> {
        let mut counts = BlockCounts::default();
        let mut disk_len = backing.metadata()?.len();
        if self.low_water < disk_len && chooser.truncation_kept() {
            backing.set_len(self.low_water)?;
            disk_len = self.low_water;
        }
        for (index, page) in &self.pages {
            let start = index * PAGE_BYTES;
            if start >= self.len {
                continue;
            }
            let keep = (self.len - start).min(PAGE_BYTES) as usize;
            let overwrote = start < disk_len.min(self.base_len);
            let fate = chooser.fate(*index, overwrote);
            match fate {
                Fate::Kept => {
                    backing.write_all_at(&page[..keep], start)?;
                    counts.kept += 1;
                }
                Fate::Lost => counts.lost += 1,
                Fate::Torn | Fate::Garbage => {
                    // Sectors past the disk's end stay out: a torn block changes only
                    // what the disk held.
                    let within = keep.min((disk_len - start) as usize);
                    for sector in 0..within.div_ceil(SECTOR_BYTES) {
                        if !chooser.sector_new(*index, sector as u64) {
                            continue;
                        }
                        let from = sector * SECTOR_BYTES;
                        let to = (from + SECTOR_BYTES).min(within);
                        let bytes = if fate == Fate::Torn {
                            page[from..to].to_vec()
                        } else {
                            chooser.garbage(*index, sector as u64)[..to - from].to_vec()
                        };
                        backing.write_all_at(&bytes, start + from as u64)?;
                    }
                    if fate == Fate::Torn {
                        counts.torn += 1;
                    } else {
                        counts.garbled += 1;
                    }
                }
            }
        }
        Ok(counts)
    }
}

fn read_fully(file: &File, buffer: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        let got = file.read_at(&mut buffer[done..], offset + done as u64)?;
        if got == 0 {
            break;
        }
        done += got;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing(content: &[u8]) -> (tempfile::NamedTempFile, File) {
        let temp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(temp.path(), content).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(temp.path())
            .unwrap();
        (temp, file)
    }

    #[test]
    fn reads_see_writes_and_the_backing_file_does_not_until_a_sync() {
        let (temp, file) = backing(&[b'a'; 5000]);
        let mut dirty = Dirty::new(5000);
        dirty.write(&file, 4094, b"XYZW").unwrap();
        dirty.write(&file, 6000, b"end").unwrap();
        assert_eq!(dirty.len, 6003);
        let seen = dirty.read(&file, 4090, 20).unwrap();
        assert_eq!(&seen, b"aaaaXYZWaaaaaaaaaaaa");
        assert_eq!(std::fs::read(temp.path()).unwrap(), vec![b'a'; 5000]);
        dirty.flush_to(&file).unwrap();
        let after = std::fs::read(temp.path()).unwrap();
        assert_eq!(after.len(), 6003);
        assert_eq!(&after[4094..4098], b"XYZW");
        assert_eq!(&after[5000..5003], &[0, 0, 0]);
        assert_eq!(&after[6000..], b"end");
    }

    #[test]
    fn a_truncation_hides_backing_bytes_until_synced() {
        let (temp, file) = backing(&[b'b'; 9000]);
        let mut dirty = Dirty::new(9000);
        dirty.truncate(100);
        dirty.truncate(8192);
        assert_eq!(dirty.read(&file, 98, 4).unwrap(), vec![b'b', b'b', 0, 0]);
        dirty.flush_to(&file).unwrap();
        let after = std::fs::read(temp.path()).unwrap();
        assert_eq!(after.len(), 8192);
        assert_eq!(after[100], 0);
    }

    #[test]
    fn reorder_keeps_some_blocks_and_not_others_the_same_way_each_time() {
        use crate::model::Model;
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let (temp, file) = backing(&[b'o'; 16 * 4096]);
            let mut dirty = Dirty::new(16 * 4096);
            for index in 0..16 {
                dirty.write(&file, index * 4096, &[b'n'; 4096]).unwrap();
            }
            let chooser = Chooser::new(Model::Reorder, 11, std::path::Path::new("f"));
            let counts = dirty.cut_with(&file, &chooser).unwrap();
            assert_eq!(counts.kept + counts.lost, 16);
            assert!(counts.kept >= 1 && counts.lost >= 1, "{counts:?}");
            let after = std::fs::read(temp.path()).unwrap();
            let firsts: Vec<u8> = after.iter().step_by(4096).copied().collect();
            outcomes.push(firsts);
        }
        assert_eq!(outcomes[0], outcomes[1]);
    }

    #[test]
    fn garble_leaves_sectors_that_are_neither_old_nor_new() {
        use crate::model::Model;
        let (temp, file) = backing(&[b'o'; 64 * 4096]);
        let mut dirty = Dirty::new(64 * 4096);
        dirty.write(&file, 0, &[b'n'; 64 * 4096]).unwrap();
        let chooser = Chooser::new(Model::Garble, 5, std::path::Path::new("f"));
        let counts = dirty.cut_with(&file, &chooser).unwrap();
        assert!(counts.torn >= 1 && counts.garbled >= 1, "{counts:?}");
        let after = std::fs::read(temp.path()).unwrap();
        assert_eq!(after.len(), 64 * 4096);
        let strange = after
            .chunks(512)
            .filter(|s| s.iter().any(|b| *b != b'o' && *b != b'n'));
        assert!(strange.count() >= 1);
    }

    #[test]
    fn a_tear_keeps_the_last_write_up_to_the_first_boundary() {
        let (temp, file) = backing(&[b'o'; 8192]);
        let mut dirty = Dirty::new(8192);
        dirty.write(&file, 0, &[b'n'; 8192]).unwrap();
        assert_eq!(dirty.tear_last_write(&file, 4096).unwrap(), 4096);
        let after = std::fs::read(temp.path()).unwrap();
        assert!(after[..4096].iter().all(|byte| *byte == b'n'));
        assert!(after[4096..].iter().all(|byte| *byte == b'o'));
        let mut small = Dirty::new(8192);
        small.write(&file, 512, &[b's'; 512]).unwrap();
        assert_eq!(small.tear_last_write(&file, 512).unwrap(), 0);
    }
}
