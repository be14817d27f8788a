//! Large message bodies for the SQLite store, kept outside SQLite's pages in append-only
//! segment files. In the database, a body is written twice (to the WAL, fsync'd before the
//! 250, then into the database file at checkpoint) in 4 KiB pages, each its own write and
//! checksum, all on the one writer thread: at 100 KB that thread and the disk were the limit.
//! A spooled body is written once, in one write, and made durable by one `fdatasync` of its
//! segment per batch, before the batch's COMMIT: a committed row never points at bytes that
//! are not on disk. Every row also carries the body's blake3 checksum (see `rows`), checked
//! before a byte of it is forwarded.
//!
//! Segments only grow; the writer seals one at a batch boundary once it is large, and a new
//! process starts a new one (so a torn tail is never appended to). The writer holds an
//! exclusive lock on the segment it appends to, released only after the batch that last
//! appended has ended: a segment anyone else can lock has every row pointing into it
//! committed, and gets no new ones. Such a segment that no committed row points at any more
//! (retention purged them) is removed, by this process or another (`queue purge`).
//!
//! A segment gets its name only once its writer holds it: it is created under a temporary
//! name of its own, locked, and then linked to the first free segment id (`link` fails on a
//! taken name, so processes sharing a store never share a segment), and the temporary name
//! is dropped. A collector therefore never sees an unlocked segment that is about to receive
//! bodies, and a failed step leaves nothing that blocks the next try.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::record::StoreError;
use crate::rows::Columns;

/// Bodies at least this large are spooled; smaller ones stay inline, where they cost less
/// than a second fsync per batch.
pub(crate) const SPOOL_MIN: usize = 32 * 1024;

/// A segment is sealed (and a new one begun) once it holds this much.
const SEGMENT_MAX: u64 = 64 * 1024 * 1024;

/// Creating a segment gives up after this many lost races (another process took the id, or
/// a collector removed the temporary file): each one means someone else made progress.
const CREATE_TRIES: usize = 64;

const SEGMENT_SUFFIX: &str = ".seg";
/// Temporary files: `.new-<nonce>.tmp`, never parsed as segments.
const TEMP_PREFIX: &str = ".new-";
const TEMP_SUFFIX: &str = ".tmp";

/// Where a spooled body is: segment and byte offset (its length is the record's size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
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

/// A test's step between creating a temporary file and locking it; an error fails the step.
#[cfg(test)]
type CreateHook = Box<dyn FnMut(&Path) -> std::io::Result<()> + Send>;

/// The writer's side: appends, syncs before each commit, seals after one.
pub(crate) struct Spool {
    dir: PathBuf,
    /// Locked (exclusively) for as long as it is open.
    current: Option<Segment>,
    /// Runs between creating a segment's temporary file and locking it (tests only).
    #[cfg(test)]
    after_create: Option<CreateHook>,
}

/// The readers' side, for any thread.
#[derive(Clone)]
pub(crate) struct SpoolReader {
    dir: PathBuf,
}

/// Files locked by the garbage collector: sealed segments (whatever points into them is
/// committed) and temporary files no writer holds.
pub(crate) struct Sealed {
    segments: Vec<(i64, File)>,
    temporaries: Vec<(PathBuf, File)>,
}

fn segment_path(dir: &Path, id: i64) -> PathBuf {
    dir.join(format!("{id:016}{SEGMENT_SUFFIX}"))
}

fn segment_ids(dir: &Path) -> std::io::Result<Vec<i64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(id) = name
            .strip_suffix(SEGMENT_SUFFIX)
            .and_then(|n| n.parse().ok())
        {
            ids.push(id);
        }
    }
    Ok(ids)
}

fn temporaries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX) {
            found.push(entry.path());
        }
    }
    Ok(found)
}

/// The directory holding `path`; a bare file name's parent is the empty path, which names no
/// directory: it is the working directory.
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Makes a directory entry (a new file, or the directory itself) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Whether `path` still names the file open as `file`: only then may a collector holding
/// `file`'s lock unlink the name (another collector may have removed it, and a writer given
/// the id since).
fn names_same_file(path: &Path, file: &File) -> std::io::Result<bool> {
    let held = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(named.dev() == held.dev() && named.ino() == held.ino()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

impl Spool {
    /// Opens the spool directory, creating it; new bodies go to a segment after every existing
    /// one.
    pub(crate) fn open(dir: &Path) -> std::io::Result<(Spool, SpoolReader)> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            sync_dir(parent_dir(dir))?;
        }
        let reader = SpoolReader {
            dir: dir.to_path_buf(),
        };
        let spool = Spool {
            dir: dir.to_path_buf(),
            current: None,
            #[cfg(test)]
            after_create: None,
        };
        Ok((spool, reader))
    }

    /// A new segment after every existing one, locked before it has its name (see the
    /// module's comment). On an error nothing of it is left behind.
    fn create_segment(&mut self) -> std::io::Result<Segment> {
        for _ in 0..CREATE_TRIES {
            let temp = self.dir.join(format!(
                "{TEMP_PREFIX}{}-{:016x}{TEMP_SUFFIX}",
                std::process::id(),
                fastrand::u64(..)
            ));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&temp)?;
            #[cfg(test)]
            if let Some(hook) = self.after_create.as_mut() {
                if let Err(e) = hook(&temp) {
                    let _ = std::fs::remove_file(&temp);
                    return Err(e);
                }
            }
            match file.try_lock() {
                Ok(()) => {}
                // A collector took the unnamed file for a stale one; it removes it.
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => {
                    let _ = std::fs::remove_file(&temp);
                    return Err(e);
                }
            }
            match self.name_segment(&temp) {
                Ok(Some(id)) => {
                    return Ok(Segment {
                        id,
                        file,
                        len: 0,
                        dirty: false,
                    })
                }
                // The temporary file was removed by a collector before the lock: start over.
                Ok(None) => continue,
                Err(e) => {
                    let _ = std::fs::remove_file(&temp);
                    return Err(e);
                }
            }
        }
        Err(std::io::Error::other(format!(
            "no segment could be created in {} after {CREATE_TRIES} tries",
            self.dir.display()
        )))
    }

    /// Links the locked temporary file to the first free id and makes that durable. `None`
    /// when the temporary file is gone.
    fn name_segment(&self, temp: &Path) -> std::io::Result<Option<i64>> {
        let mut id = segment_ids(&self.dir)?
            .into_iter()
            .max()
            .map_or(1, |id| id + 1);
        loop {
            let path = segment_path(&self.dir, id);
            match std::fs::hard_link(temp, &path) {
                Ok(()) => {}
                // Taken by another process meanwhile.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    id += 1;
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            }
            let durable = std::fs::remove_file(temp).and_then(|()| sync_dir(&self.dir));
            if let Err(e) = durable {
                // Nothing points into it yet and we hold its lock: the name can go.
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            return Ok(Some(id));
        }
    }

    /// Appends a body; durable only after the next `sync`.
    pub(crate) fn append(&mut self, body: &[u8]) -> std::io::Result<Location> {
        if self.current.is_none() {
            self.current = Some(self.create_segment()?);
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
    pub(crate) fn sync(&mut self) -> std::io::Result<()> {
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
    pub(crate) fn after_batch(&mut self) {
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
    pub(crate) fn read(&self, at: Location, len: usize) -> std::io::Result<Vec<u8>> {
        let file = File::open(segment_path(&self.dir, at.segment))?;
        let mut body = vec![0; len];
        file.read_exact_at(&mut body, at.offset as u64)?;
        Ok(body)
    }

    /// Locks every segment no writer holds, and every temporary file no writer holds (left
    /// by a writer that died between creating and naming a segment). Ask which segments rows
    /// point at only after this: a segment's last rows were committed before its writer let
    /// go of it.
    pub(crate) fn lock_sealed(&self) -> std::io::Result<Sealed> {
        let mut sealed = Sealed {
            segments: Vec::new(),
            temporaries: Vec::new(),
        };
        for id in segment_ids(&self.dir)? {
            if let Some(file) = try_lock_path(&segment_path(&self.dir, id))? {
                sealed.segments.push((id, file));
            }
        }
        for path in temporaries(&self.dir)? {
            if let Some(file) = try_lock_path(&path)? {
                sealed.temporaries.push((path, file));
            }
        }
        Ok(sealed)
    }

    /// Removes the locked segments that no committed row points at, and the locked
    /// temporary files; returns how many segments.
    pub(crate) fn remove_unreferenced(
        &self,
        sealed: Sealed,
        referenced: &HashSet<i64>,
    ) -> std::io::Result<usize> {
        let mut removed = 0;
        for (id, lock) in sealed.segments {
            let path = segment_path(&self.dir, id);
            if !referenced.contains(&id) && names_same_file(&path, &lock)? {
                std::fs::remove_file(path)?;
                removed += 1;
            }
        }
        for (path, lock) in sealed.temporaries {
            // A writer that finds its temporary file gone starts over.
            if names_same_file(&path, &lock)? {
                std::fs::remove_file(path)?;
            }
        }
        Ok(removed)
    }
}

/// The file at `path`, locked, or `None` when someone else holds it or it is gone.
fn try_lock_path(path: &Path) -> std::io::Result<Option<File>> {
    let file = match File::open(path) {
        Ok(file) => file,
        // Removed meanwhile by another collector.
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// A row of `messages` whose body may be spooled: `content` reads the segment when the column
/// is NULL and the row has a location. The query must select spool_segment, spool_offset and
/// size.
pub(crate) struct WithSpool<'a, R> {
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
            .map_err(|e| {
                let reason = format!("segment {segment} at {offset}: {e}");
                if is_damage(&e) {
                    StoreError::SpoolDamage(reason)
                } else {
                    StoreError::Spool(reason)
                }
            })?;
        Ok(Some(body))
    }
}

/// Whether a failed read of a body says the bytes themselves are not there in full (the
/// segment is gone, or ends before the body does): the record is then damaged for good.
/// Anything else (out of file descriptors, out of memory, a permission or I/O error of the
/// moment) is a passing failure: the claim fails and the record waits, unmarked, for the
/// next one, as it does when the database is unavailable.
fn is_damage(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::NotFound | ErrorKind::UnexpectedEof | ErrorKind::InvalidData
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_missing_or_short_bodies_are_damage() {
        let damage = |kind: ErrorKind| is_damage(&std::io::Error::from(kind));
        assert!(damage(ErrorKind::NotFound));
        assert!(damage(ErrorKind::UnexpectedEof));
        // EMFILE, ENOMEM, EACCES, EISDIR: the bytes may well be fine.
        assert!(!is_damage(&std::io::Error::from_raw_os_error(24)));
        assert!(!damage(ErrorKind::OutOfMemory));
        assert!(!damage(ErrorKind::PermissionDenied));
        assert!(!damage(ErrorKind::IsADirectory));
    }

    fn ids(sealed: &Sealed) -> Vec<i64> {
        let mut ids: Vec<i64> = sealed.segments.iter().map(|(id, _)| *id).collect();
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

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A collector that lists the directory between the writer's create and its lock.
    #[test]
    fn a_collector_between_create_and_lock_cannot_take_the_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let (mut spool, reader) = Spool::open(&path).unwrap();
        let (_, collector) = Spool::open(&path).unwrap();
        let mut once = Some(collector);
        spool.after_create = Some(Box::new(move |_| {
            if let Some(collector) = once.take() {
                let sealed = collector.lock_sealed().unwrap();
                collector
                    .remove_unreferenced(sealed, &HashSet::new())
                    .unwrap();
            }
            Ok(())
        }));
        let at = spool.append(b"acknowledged body").unwrap();
        spool.sync().unwrap();
        assert_eq!(names(&path), ["0000000000000001.seg"]);
        // The writer holds it: a collector now can neither lock nor remove it.
        assert!(ids(&reader.lock_sealed().unwrap()).is_empty());
        assert_eq!(reader.read(at, 17).unwrap(), b"acknowledged body");
        drop(spool);
        let (_, after_restart) = Spool::open(&path).unwrap();
        assert_eq!(after_restart.read(at, 17).unwrap(), b"acknowledged body");
    }

    /// A collector that locked the unnamed file first: the writer starts over with another.
    #[test]
    fn a_temporary_file_held_by_a_collector_is_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let (mut spool, reader) = Spool::open(&path).unwrap();
        let held = std::sync::Arc::new(std::sync::Mutex::new(None));
        let slot = held.clone();
        spool.after_create = Some(Box::new(move |_| {
            let mut slot = slot.lock().unwrap();
            if slot.is_none() {
                *slot = Some(reader.lock_sealed().unwrap());
            }
            Ok(())
        }));
        let at = spool.append(b"body").unwrap();
        spool.sync().unwrap();
        let sealed = held.lock().unwrap().take().unwrap();
        assert_eq!(sealed.temporaries.len(), 1);
        let (_, collector) = Spool::open(&path).unwrap();
        collector
            .remove_unreferenced(sealed, &HashSet::new())
            .unwrap();
        assert_eq!(names(&path), ["0000000000000001.seg"]);
        assert_eq!(collector.read(at, 4).unwrap(), b"body");
    }

    /// Two processes (the relay and `queue` or `sendmail`) on one store.
    #[test]
    fn two_writers_on_one_directory_never_share_a_segment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let (mut first, reader) = Spool::open(&path).unwrap();
        let (mut second, _) = Spool::open(&path).unwrap();
        let a = first.append(b"from the first").unwrap();
        let b = second.append(b"from the second").unwrap();
        first.sync().unwrap();
        second.sync().unwrap();
        assert_ne!(a.segment, b.segment);
        assert_eq!(reader.read(a, 14).unwrap(), b"from the first");
        assert_eq!(reader.read(b, 15).unwrap(), b"from the second");
    }

    /// Another process takes the id the writer computed, and one creation fails outright:
    /// neither blocks the next append.
    #[test]
    fn a_taken_id_or_a_failed_step_does_not_block_later_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let (mut spool, reader) = Spool::open(&path).unwrap();
        let mut step = 0;
        let spool_dir = path.clone();
        spool.after_create = Some(Box::new(move |_| {
            step += 1;
            match step {
                1 => Err(std::io::Error::other("injected lock failure")),
                // Someone names segment 1 between our scan and our link.
                2 => std::fs::write(segment_path(&spool_dir, 1), b"").map(|_| ()),
                _ => Ok(()),
            }
        }));
        assert!(spool.append(b"refused").is_err());
        assert_eq!(names(&path), Vec::<String>::new(), "nothing left behind");
        let at = spool.append(b"accepted").unwrap();
        spool.sync().unwrap();
        assert_eq!(at.segment, 2);
        assert_eq!(reader.read(at, 8).unwrap(), b"accepted");
    }

    #[test]
    fn a_bare_file_name_lives_in_the_working_directory() {
        assert_eq!(parent_dir(Path::new("idemrelay.db.spool")), Path::new("."));
        assert_eq!(parent_dir(Path::new("data/x.db")), Path::new("data"));
        assert_eq!(parent_dir(Path::new("/x.db")), Path::new("/"));
    }
}
