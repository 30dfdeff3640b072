//! `Buf<T>`: an immutable array that is owned, a view into a memory-mapped file, or memory
//! another owner keeps alive (an array handed over from Python, read in place).
//!
//! Invariant: a mapped view is aligned for `T` and lies inside its mapping; both are checked
//! when the view is made, so dereferencing never reads out of bounds or misaligned. Borrowed
//! memory carries its owner, and [`Buf::borrowed`]'s caller promises it stays valid and
//! unchanged while that owner lives.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

/// Plain-old-data element types that may be viewed directly in a little-endian file.
///
/// # Safety
/// Implementors must be valid for every bit pattern and have no padding.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}
// SAFETY: primitive integers and floats are valid for every bit pattern and have no padding.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for i16 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}
// SAFETY: as above.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for f64 {}

/// An immutable array, owned or memory-mapped.
pub enum Buf<T: Pod> {
    Owned(Vec<T>),
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
        /// A read-only view of a file (its pages can be dropped and read again), not an
        /// anonymous copy ([`Buf::on_huge_pages`], whose dropped pages would read as zeros).
        file: bool,
        /// The mapped file, where [`Buf::read_into`] reads rows with `pread` instead of
        /// through the mapping ([`Buf::read_through`]).
        reader: Option<Arc<std::fs::File>>,
        _t: PhantomData<T>,
    },
    /// `len` elements at address `at`, kept alive by `owner`.
    Borrowed {
        owner: Arc<dyn std::any::Any + Send + Sync>,
        at: usize,
        len: usize,
        _t: PhantomData<T>,
    },
}

impl<T: Pod> Buf<T> {
    /// A view of `len` elements of `map` starting at byte `offset`, or `None` when the range is
    /// out of bounds or misaligned for `T`.
    pub fn mapped(map: Arc<Mmap>, offset: usize, len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let end = offset.checked_add(bytes)?;
        if end > map.len() || (map.as_ptr() as usize + offset) % std::mem::align_of::<T>() != 0 {
            return None;
        }
        Some(Buf::Mapped { map, offset, len, file: true, reader: None, _t: PhantomData })
    }

    /// `len` elements at `ptr`, read in place while `owner` (what keeps them alive, e.g. a
    /// reference to the Python array that holds them) lives; `None` when `ptr` is misaligned.
    ///
    /// # Safety
    /// `ptr` must point to `len` initialised elements that stay valid, and are not written,
    /// until `owner` is dropped.
    pub unsafe fn borrowed(
        owner: Arc<dyn std::any::Any + Send + Sync>,
        ptr: *const T,
        len: usize,
    ) -> Option<Self> {
        if (ptr as usize) % std::mem::align_of::<T>() != 0 || ptr.is_null() {
            return None;
        }
        Some(Buf::Borrowed { owner, at: ptr as usize, len, _t: PhantomData })
    }

    /// True when the elements are read in place from memory another owner holds.
    pub fn is_borrowed(&self) -> bool {
        matches!(self, Buf::Borrowed { .. })
    }

    /// True when the data lives in a file mapping rather than in owned memory.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Buf::Mapped { .. })
    }

    /// Hands the pages of elements `range` back to the system where they are a file's
    /// (`MADV_DONTNEED`): they leave the process's resident set and are read again (from the
    /// page cache, or the file) when next touched. How a mapped array larger than the memory
    /// budget is read a piece at a time. Does nothing to owned or borrowed memory, or where the
    /// system refuses (the pages then stay, as before).
    pub fn release(&self, range: std::ops::Range<usize>) {
        let Buf::Mapped { map, offset, file: true, .. } = self else { return };
        let size = std::mem::size_of::<T>();
        let (start, end) = (range.start.min(self.len()), range.end.min(self.len()));
        // SAFETY: `file`: a read-only view of a file, never written through
        unsafe { release_file_pages(map, offset + start * size..offset + end * size) }
    }

    /// A file view that reads through `file` — the file `map` maps from its first byte —
    /// with [`Buf::read_into`]: a read's pages then never enter the process's resident set.
    /// (Through the mapping, a row read maps whole page-cache folios around it — up to 2 MiB
    /// on file systems with large folios: 165 MiB of a 195 MiB feature file was resident
    /// between releases every 16 MiB of 4 KiB rows, 2026-12-03.) Other buffers are returned
    /// as they are.
    pub fn read_through(self, file: Arc<std::fs::File>) -> Self {
        match self {
            Buf::Mapped { map, offset, len, file: true, .. } => {
                Buf::Mapped { map, offset, len, file: true, reader: Some(file), _t: PhantomData }
            }
            other => other,
        }
    }

    /// Elements `start..start + out.len()` into `out`: read from the file where the view has
    /// one ([`Buf::read_through`]), copied otherwise.
    pub fn read_into(&self, start: usize, out: &mut [T]) -> std::io::Result<()> {
        match self {
            Buf::Mapped { offset, reader: Some(f), .. } => {
                assert!(start + out.len() <= self.len(), "elements {start}.. past the end");
                let size = std::mem::size_of::<T>();
                // SAFETY: T is Pod (any bytes are a valid T); the byte slice covers `out` exactly
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, std::mem::size_of_val(out))
                };
                std::os::unix::fs::FileExt::read_exact_at(&**f, bytes, (offset + start * size) as u64)
            }
            _ => {
                out.copy_from_slice(&self[start..start + out.len()]);
                Ok(())
            }
        }
    }

    /// True when [`Buf::read_into`] reads from a file.
    pub fn reads_through_file(&self) -> bool {
        matches!(self, Buf::Mapped { reader: Some(_), .. })
    }

    /// Hands all of a file view's pages back ([`Buf::release`] over every element).
    pub fn release_all(&self) {
        self.release(0..self.len());
    }

    /// True when the elements are a read-only view of a file, whose pages [`Buf::release`]
    /// hands back.
    pub fn is_file_view(&self) -> bool {
        matches!(self, Buf::Mapped { file: true, .. })
    }

    /// The elements copied into anonymous memory the system is asked to back with huge pages
    /// (Linux transparent huge pages, where enabled): random reads over a large array then
    /// miss the TLB far less than over a file mapping's 4 KB pages.
    pub fn on_huge_pages(&self) -> std::io::Result<Buf<T>> {
        let bytes = std::mem::size_of_val::<[T]>(self);
        let mut m = memmap2::MmapMut::map_anon(bytes.max(1))?;
        // before the copy touches the pages: they are faulted in huge where the system can
        #[cfg(target_os = "linux")]
        let _ = m.advise(memmap2::Advice::HugePage);
        m[..bytes].copy_from_slice(as_bytes(self));
        let len = self.len();
        Ok(Buf::Mapped {
            map: Arc::new(m.make_read_only()?),
            offset: 0,
            len,
            file: false,
            reader: None,
            _t: PhantomData,
        })
    }

    /// The elements as an owned vector (copies a mapped view).
    pub fn into_vec(self) -> Vec<T> {
        match self {
            Buf::Owned(v) => v,
            mapped => mapped.to_vec(),
        }
    }
}

impl<T: Pod> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Owned(v) => v,
            Buf::Mapped { map, offset, len, .. } => {
                // SAFETY: `mapped` checked that offset..offset+len*size_of::<T>() lies inside the
                // mapping and is aligned for T; T is Pod so any bytes are a valid T; the mapping is
                // read-only and kept alive by the Arc for the lifetime of &self.
                unsafe { std::slice::from_raw_parts(map.as_ptr().add(*offset) as *const T, *len) }
            }
            // SAFETY: `borrowed`'s caller promised `len` valid, unchanging, aligned elements at
            // `at` while `owner` lives, which it does for the lifetime of &self.
            Buf::Borrowed { at, len, .. } => unsafe { std::slice::from_raw_parts(*at as *const T, *len) },
        }
    }
}

impl<T: Pod> From<Vec<T>> for Buf<T> {
    fn from(v: Vec<T>) -> Self {
        Buf::Owned(v)
    }
}

impl<T: Pod> Clone for Buf<T> {
    fn clone(&self) -> Self {
        match self {
            Buf::Owned(v) => Buf::Owned(v.clone()),
            Buf::Mapped { map, offset, len, file, reader, .. } => Buf::Mapped {
                map: map.clone(),
                offset: *offset,
                len: *len,
                file: *file,
                reader: reader.clone(),
                _t: PhantomData,
            },
            Buf::Borrowed { owner, at, len, .. } => {
                Buf::Borrowed { owner: owner.clone(), at: *at, len: *len, _t: PhantomData }
            }
        }
    }
}

impl<T: Pod + fmt::Debug> fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Buf::Owned(_) => "owned",
            Buf::Mapped { .. } => "mapped",
            Buf::Borrowed { .. } => "borrowed",
        };
        write!(f, "Buf<{kind}, len {}>", self.len())
    }
}

impl<T: Pod + PartialEq> PartialEq for Buf<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

/// Drops the whole pages inside bytes `range` of `map` from the resident set (`MADV_DONTNEED`);
/// a page shared with bytes outside the range stays. Errors are ignored (the pages stay).
///
/// # Safety
/// `map` must map a file read-only and never be written through: dropped pages are then read
/// back from the file unchanged and every slice of it stays valid. (An anonymous mapping's
/// dropped pages would read as zeros.)
pub(crate) unsafe fn release_file_pages(map: &Mmap, range: std::ops::Range<usize>) {
    let (start, end) = (range.start.min(map.len()), range.end.min(map.len()));
    let page = page_size();
    let base = map.as_ptr() as usize;
    let first = (base + start).next_multiple_of(page) - base;
    let last = (base + end) / page * page - base;
    if first < last {
        // SAFETY: forwarded to the caller; the range lies inside the mapping
        let _ =
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first) };
    }
}

/// The system's page size (4 KiB where it cannot be read).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// View a slice of Pod values as bytes (little-endian machines only; see `lib.rs`).
pub fn as_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding, any bit pattern), the byte slice covers exactly the same
    // memory and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// View a mutable slice of Pod values as bytes, to read a file's bytes straight into it.
pub fn as_bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: T is Pod (no padding, any bit pattern is a valid T, so any bytes written through
    // the view are too); the byte slice covers exactly the same memory and borrows it mutably
    // for the same lifetime.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrowed_memory_is_read_in_place_while_its_owner_lives() {
        let owner: Arc<Vec<f32>> = Arc::new(vec![1.0, 2.0, 3.0]);
        let ptr = owner.as_ptr();
        // SAFETY: three elements the Arc keeps alive and nobody writes.
        let b = unsafe { Buf::borrowed(owner.clone(), ptr, 3) }.unwrap();
        assert!(b.is_borrowed() && !b.is_mapped());
        assert_eq!(&*b, &[1.0, 2.0, 3.0]);
        assert_eq!(b.as_ptr(), ptr, "no copy");
        let c = b.clone();
        drop(b);
        assert_eq!(c.into_vec(), vec![1.0, 2.0, 3.0]);
        // SAFETY: misaligned on purpose: refused before any read
        let odd = unsafe { Buf::<f32>::borrowed(owner, (ptr as usize + 1) as *const f32, 1) };
        assert!(odd.is_none());
    }

    /// Pages of the mapping in this process's resident set (its `Rss` in /proc/self/smaps):
    /// what `release` hands back. (`mincore` would report the page cache's pages instead.)
    fn resident_pages(map: &Mmap) -> usize {
        let start = format!("{:x}-", map.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let entry = smaps.split_inclusive('\n').skip_while(|l| !l.starts_with(&start)).skip(1);
        // the first Rss line after the mapping's header is its own (Size, page sizes, Rss)
        let rss = entry.take(4).find_map(|l| l.strip_prefix("Rss:")).expect("the mapping's Rss line");
        let kb: usize = rss.split_whitespace().next().unwrap().parse().unwrap();
        kb * 1024 / page_size()
    }

    #[test]
    fn a_file_views_pages_are_handed_back_and_read_again_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let values: Vec<u32> = (0..1u32 << 20).map(|i| i.wrapping_mul(2654435761)).collect();
        std::fs::write(&path, as_bytes(&values)).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a file this test wrote and nobody changes
        let map = Arc::new(unsafe { Mmap::map(&file) }.unwrap());
        let b: Buf<u32> = Buf::mapped(map.clone(), 0, values.len()).unwrap();
        assert!(b.is_file_view());
        assert_eq!(&*b, &values[..]);
        let pages = map.len() / page_size();
        assert_eq!(resident_pages(&map), pages);
        // half of it handed back: an element range, whole pages inside it only
        b.release(0..values.len() / 2);
        let left = resident_pages(&map);
        assert!(left <= pages / 2 + 1 && left >= pages / 2, "{left} of {pages} pages resident");
        assert_eq!(&*b, &values[..], "read again unchanged");
        b.release_all();
        assert_eq!(resident_pages(&map), 0);
        assert_eq!(b[12345], values[12345]);
        // an anonymous copy is never handed back: its pages would read as zeros
        let copy = b.on_huge_pages().unwrap();
        assert!(!copy.is_file_view());
        copy.release_all();
        assert_eq!(&*copy, &values[..]);
    }
}
