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
        Some(Buf::Mapped { map, offset, len, _t: PhantomData })
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
        Ok(Buf::Mapped { map: Arc::new(m.make_read_only()?), offset: 0, len, _t: PhantomData })
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
            Buf::Mapped { map, offset, len, .. } => {
                Buf::Mapped { map: map.clone(), offset: *offset, len: *len, _t: PhantomData }
            }
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

/// View a slice of Pod values as bytes (little-endian machines only; see `lib.rs`).
pub fn as_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding, any bit pattern), the byte slice covers exactly the same
    // memory and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
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
}
