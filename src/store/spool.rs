//! Large message bodies for the SQLite store, kept outside SQLite's pages in append-only
//! segment files. In the database, a body is written twice (to the WAL, fsync'd before the
//! 250, then into the database file at checkpoint) in 4 KiB pages, each its own write and
//! checksum, all on the one writer thread: at 100 KB that thread and the disk were the limit.
//! A spooled body is written once, in one write, and made durable by one `fdatasync` of its
//! segment per batch, before the batch's COMMIT: a committed row never points at bytes that
//! are not on disk.
//!
//! Segments only grow; the writer seals one at a batch boundary once it is large, and a new
//! process starts a new one (so a torn tail is never appended to). The writer holds an
//! exclusive lock on the segment it appends to, released only after the batch that last
//! appended has ended: a segment anyone else can lock has every row pointing into it
//! committed, and gets no new ones. Such a segment that no committed row points at any more
//! (retention purged them) is removed, by this process or another (`queue purge`).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::rows::Columns;
use super::StoreError;

/// Bodies at least this large are spooled; smaller ones stay inline, where they cost less
/// than a second fsync per batch.
pub const SPOOL_MIN: usize = 32 * 1024;

/// A segment is sealed (and a new one begun) once it holds this much.
const SEGMENT_MAX: u64 = 64 * 1024 * 1024;

/// Where a spooled body is: segment and byte offset (its length is the record's size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub segment: i64,
    pub offset: i64,
}

struct Segment {
    id: i64,
    file: File,
    len: u64,
    /// Appended to since the last sync.
    dirty: bool,
}

/// The writer's side: appends, syncs before each commit, seals after one.
pub struct Spool {
    dir: PathBuf,
    next_id: i64,
    /// Locked (exclusively) for as long as it is open.
    current: Option<Segment>,
}

/// The readers' side, for any thread.
#[derive(Clone)]
pub struct SpoolReader {
    dir: PathBuf,
}

/// Segments locked by the garbage collector: sealed, so whatever points into them is
/// committed.
pub struct Sealed(Vec<(i64, File)>);

fn segment_path(dir: &Path, id: i64) -> PathBuf {
    dir.join(format!("{id:016}.seg"))
}

fn segment_ids(dir: &Path) -> std::io::Result<Vec<i64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(id) = name.strip_suffix(".seg").and_then(|n| n.parse().ok()) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Makes a directory entry (a new file, or the directory itself) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Spool {
    /// Opens the spool directory, creating it; new bodies go to a segment after every existing
    /// one.
    pub fn open(dir: &Path) -> std::io::Result<(Spool, SpoolReader)> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let next_id = segment_ids(dir)?.into_iter().max().map_or(1, |id| id + 1);
        let reader = SpoolReader {
            dir: dir.to_path_buf(),
        };
        let spool = Spool {
            dir: dir.to_path_buf(),
            next_id,
            current: None,
        };
        Ok((spool, reader))
    }

    /// Appends a body; durable only after the next `sync`.
    pub fn append(&mut self, body: &[u8]) -> std::io::Result<Location> {
        if self.current.is_none() {
            let id = self.next_id;
            let path = segment_path(&self.dir, id);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            file.lock()?;
            sync_dir(&self.dir)?;
            self.next_id += 1;
            self.current = Some(Segment {
                id,
                file,
                len: 0,
                dirty: false,
            });
        }
        let segment = self.current.as_mut().expect("a segment is open");
        // At the recorded length, not the file's end: a failed earlier append may have left
        // bytes past it, which this one writes over.
        segment.file.write_all_at(body, segment.len)?;
        let offset = segment.len;
        segment.len += body.len() as u64;
        segment.dirty = true;
        Ok(Location {
            segment: segment.id,
            offset: offset as i64,
        })
    }

    /// Makes every append so far durable; called before the batch's COMMIT. After a failed
    /// sync the segment is abandoned: what the kernel kept of it is no longer known.
    pub fn sync(&mut self) -> std::io::Result<()> {
        let Some(segment) = self.current.as_mut() else {
            return Ok(());
        };
        if !segment.dirty {
            return Ok(());
        }
        if let Err(err) = segment.file.sync_data() {
            self.current = None;
            return Err(err);
        }
        segment.dirty = false;
        Ok(())
    }

    /// After a batch ended (committed or not): seals a full segment, which releases its lock.
    /// Every row pointing into it is committed by now.
    pub fn after_batch(&mut self) {
        if self
            .current
            .as_ref()
            .is_some_and(|s| s.len >= SEGMENT_MAX && !s.dirty)
        {
            self.current = None;
        }
    }
}

impl SpoolReader {
    pub fn read(&self, at: Location, len: usize) -> std::io::Result<Vec<u8>> {
        let file = File::open(segment_path(&self.dir, at.segment))?;
        let mut body = vec![0; len];
        file.read_exact_at(&mut body, at.offset as u64)?;
        Ok(body)
    }

    /// Locks every segment no writer holds. Ask which segments rows point at only after
    /// this: a segment's last rows were committed before its writer let go of it.
    pub fn lock_sealed(&self) -> std::io::Result<Sealed> {
        let mut sealed = Vec::new();
        for id in segment_ids(&self.dir)? {
            let file = match File::open(segment_path(&self.dir, id)) {
                Ok(file) => file,
                // Removed meanwhile by another collector.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match file.try_lock() {
                Ok(()) => sealed.push((id, file)),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
        Ok(Sealed(sealed))
    }

    /// Removes the locked segments that no committed row points at; returns how many.
    pub fn remove_unreferenced(
        &self,
        sealed: Sealed,
        referenced: &HashSet<i64>,
    ) -> std::io::Result<usize> {
        let mut removed = 0;
        for (id, _lock) in sealed.0 {
            if !referenced.contains(&id) {
                std::fs::remove_file(segment_path(&self.dir, id))?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// A row of `messages` whose body may be spooled: `content` reads the segment when the column
/// is NULL and the row has a location. The query must select spool_segment, spool_offset and
/// size.
pub struct WithSpool<'a, R> {
    pub row: &'a R,
    pub spool: &'a SpoolReader,
}

impl<R: Columns> Columns for WithSpool<'_, R> {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        self.row.text(col)
    }
    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError> {
        self.row.opt_text(col)
    }
    fn int(&self, col: &str) -> Result<i64, StoreError> {
        self.row.int(col)
    }
    fn opt_int(&self, col: &str) -> Result<Option<i64>, StoreError> {
        self.row.opt_int(col)
    }
    fn flag(&self, col: &str) -> Result<bool, StoreError> {
        self.row.flag(col)
    }
    fn bytes(&self, col: &str) -> Result<Vec<u8>, StoreError> {
        self.row.bytes(col)
    }
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let inline = self.row.opt_bytes(col)?;
        if col != "content" || inline.is_some() {
            return Ok(inline);
        }
        let (Some(segment), Some(offset)) = (
            self.row.opt_int("spool_segment")?,
            self.row.opt_int("spool_offset")?,
        ) else {
            return Ok(None);
        };
        let len = usize::try_from(self.row.int("size")?).unwrap_or(0);
        let body = self
            .spool
            .read(Location { segment, offset }, len)
            .map_err(|e| StoreError::Spool(format!("segment {segment} at {offset}: {e}")))?;
        Ok(Some(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(sealed: &Sealed) -> Vec<i64> {
        let mut ids: Vec<i64> = sealed.0.iter().map(|(id, _)| *id).collect();
        ids.sort();
        ids
    }

    #[test]
    fn bodies_read_back_exactly_and_a_new_process_starts_a_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spool, reader) = Spool::open(&dir.path().join("spool")).unwrap();
        let a = spool.append(b"first body").unwrap();
        let b = spool.append(&[7u8; 100_000]).unwrap();
        spool.sync().unwrap();
        assert_eq!((a.segment, a.offset, b.segment, b.offset), (1, 0, 1, 10));
        assert_eq!(reader.read(a, 10).unwrap(), b"first body");
        assert_eq!(reader.read(b, 100_000).unwrap(), vec![7u8; 100_000]);
        // The open segment is the writer's: no collector can lock it.
        assert!(ids(&reader.lock_sealed().unwrap()).is_empty());
        drop(spool);

        let (mut again, reader) = Spool::open(&dir.path().join("spool")).unwrap();
        assert_eq!(ids(&reader.lock_sealed().unwrap()), [1]);
        let c = again.append(b"after restart").unwrap();
        assert_eq!((c.segment, c.offset), (2, 0));
        assert_eq!(reader.read(a, 10).unwrap(), b"first body");
    }

    #[test]
    fn only_unlocked_unreferenced_segments_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        for _ in 0..3 {
            let (mut spool, _) = Spool::open(&path).unwrap();
            spool.append(b"x").unwrap();
            spool.sync().unwrap();
        }
        let (mut spool, reader) = Spool::open(&path).unwrap();
        assert_eq!(spool.append(b"y").unwrap().segment, 4);
        // Another process's collector (`queue purge`) sees the same.
        let (_, other) = Spool::open(&path).unwrap();
        let sealed = other.lock_sealed().unwrap();
        assert_eq!(ids(&sealed), [1, 2, 3]);
        // While one collector holds them, another skips them.
        assert!(ids(&reader.lock_sealed().unwrap()).is_empty());
        let referenced = HashSet::from([2]);
        assert_eq!(other.remove_unreferenced(sealed, &referenced).unwrap(), 2);
        let mut left = segment_ids(&path).unwrap();
        left.sort();
        assert_eq!(left, [2, 4]);
    }

    #[test]
    fn a_full_segment_is_sealed_at_the_batch_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spool, reader) = Spool::open(&dir.path().join("spool")).unwrap();
        spool.append(&vec![0u8; SEGMENT_MAX as usize]).unwrap();
        // Not synced yet: rows pointing here may still be uncommitted.
        spool.after_batch();
        assert!(ids(&reader.lock_sealed().unwrap()).is_empty());
        spool.sync().unwrap();
        spool.after_batch();
        assert_eq!(ids(&reader.lock_sealed().unwrap()), [1]);
        assert_eq!(spool.append(b"z").unwrap().segment, 2);
    }
}
