//! `Buffer<T>`: the typed handle to an allocated block.

use super::heap::TensorMeta;
use super::ids::BlockId;
use super::park::{BlockClass, Parked};
use super::{Shared, Stream};
use crate::error::{Error, Result, UsageError};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

/// `Buffer::flags`: the heap holds a tensor description of the block.
const DESCRIBED: u8 = 1;
/// `Buffer::flags`: the block was used on another stream; its free waits for that stream.
const USED_ELSEWHERE: u8 = 2;
/// `Buffer::flags`: the block cannot be parked (no block, or too large to count in `units`).
const UNPARKABLE: u8 = 4;
/// `Buffer::flags`: the block is in the large pool.
const LARGE: u8 = 8;
/// `Buffer::flags`: the block is oversize.
const OVERSIZE: u8 = 16;
/// `Buffer::flags`: the block is exactly its request rounded.
const REUSABLE: u8 = 32;
/// What makes a drop go through the lock.
const NOT_PARKED: u8 = DESCRIBED | USED_ELSEWHERE | UNPARKABLE;
/// Blocks are multiples of this.
const MIN_UNIT: u64 = super::heap::MIN_BLOCK;

/// Element types whose every bit pattern is a valid value, so that device bytes can be read
/// back as `T`.
///
/// # Safety
///
/// Implementors must be plain data: `Copy`, no padding, no pointers, and valid for any bit
/// pattern. Blocks are aligned to 512 bytes: allocating a type aligned to more is a compile
/// error of [`CachingAllocator::alloc`](crate::CachingAllocator::alloc).
pub unsafe trait Pod: Copy + Send + Sync + 'static {
    /// The dtype name reports use (`float32`, `int64`, ...).
    const DTYPE: &'static str;
}

macro_rules! pod {
    ($($t:ty => $name:literal),* $(,)?) => {
        // SAFETY: primitive integers and floats have no padding and accept any bit pattern.
        $(unsafe impl Pod for $t { const DTYPE: &'static str = $name; })*
    };
}
pod!(u8 => "uint8", i8 => "int8", u16 => "uint16", i16 => "int16", u32 => "uint32", i32 => "int32",
     u64 => "uint64", i64 => "int64", u128 => "uint128", i128 => "int128", f32 => "float32", f64 => "float64",
     usize => "uint64", isize => "int64");
#[cfg(feature = "half")]
#[cfg_attr(docsrs, doc(cfg(feature = "half")))]
pod!(half::f16 => "float16", half::bf16 => "bfloat16");

/// A typed allocation of `len` values of `T`, returned by
/// [`CachingAllocator::alloc`](crate::CachingAllocator::alloc). Dropping it returns its block.
///
/// On backends whose memory lives in this process (the host backend) its contents can be
/// written and read; on the others it is an address and a length for device code.
pub struct Buffer<T> {
    pub(crate) shared: NonNull<Shared>,
    /// `None` for an empty buffer (no block).
    block: Option<BlockId>,
    addr: u64,
    len: usize,
    stream: Stream,
    /// The block's size and what it counts in (for parking; see `park`).
    /// The block's size in 512-byte units (for parking; see `park`). Kept small: buffers
    /// live in users' vectors by the thousand.
    units: u32,
    /// The block's pool, oversize and exactness ([`LARGE`], [`OVERSIZE`], [`REUSABLE`]), set
    /// once, and what the heap holds about it beyond what the buffer knows ([`DESCRIBED`],
    /// [`USED_ELSEWHERE`]), which makes its drop go through the lock, not park.
    flags: AtomicU8,
    /// The `cudarc` stream, looked up on first use by cudarc's traits.
    #[cfg(feature = "cuda-backend")]
    cuda_stream: std::sync::OnceLock<std::sync::Arc<cudarc::driver::CudaStream>>,
    _marker: PhantomData<T>,
}

impl<T> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("stream", &self.stream.id)
            .finish()
    }
}

impl<T: Pod> Buffer<T> {
    /// # Safety
    ///
    /// The buffer must have been counted in its allocator's live buffers (see `Locked`).
    ///
    /// `lent`: the block lies in another stream's segment (the heap lent it): its free must
    /// order the owner after this buffer's stream, which the heap sees to, so it is never
    /// parked (`USED_ELSEWHERE`). Passed here rather than set on the built buffer, which kept
    /// the buffer on the stack and copied it out, a store-forwarding stall on every allocation.
    pub(crate) unsafe fn new(
        shared: NonNull<Shared>,
        block: BlockId,
        addr: u64,
        len: usize,
        stream: Stream,
        class: BlockClass,
        lent: bool,
    ) -> Self {
        Buffer {
            shared,
            block: Some(block),
            addr,
            len,
            stream,
            units: u32::try_from(class.size / MIN_UNIT).unwrap_or(0),
            flags: AtomicU8::new(
                if class.size / MIN_UNIT > u64::from(u32::MAX) { UNPARKABLE } else { 0 }
                    | if class.pool == super::Pool::Large { LARGE } else { 0 }
                    | if class.oversize { OVERSIZE } else { 0 }
                    | if class.reusable { REUSABLE } else { 0 }
                    | if lent { USED_ELSEWHERE } else { 0 },
            ),
            #[cfg(feature = "cuda-backend")]
            cuda_stream: std::sync::OnceLock::new(),
            _marker: PhantomData,
        }
    }

    /// # Safety
    ///
    /// As for [`new`](Self::new).
    pub(crate) unsafe fn empty(shared: NonNull<Shared>, stream: Stream) -> Self {
        Buffer {
            shared,
            block: None,
            addr: 0,
            len: 0,
            stream,
            units: 0,
            flags: AtomicU8::new(UNPARKABLE),
            #[cfg(feature = "cuda-backend")]
            cuda_stream: std::sync::OnceLock::new(),
            _marker: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes as requested (`len * size_of::<T>()`); the block behind it may be larger.
    pub fn num_bytes(&self) -> u64 {
        self.len as u64 * std::mem::size_of::<T>() as u64
    }

    /// The device address of the first element (`0` for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.addr
    }

    /// The stream the buffer was allocated on.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Describes the buffer as a tensor for reports: its dtype is `T`'s, its shape `shape`.
    ///
    /// ```
    /// # use vramscope::{CachingAllocator, backend::HostBackend};
    /// # let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    /// # let s = alloc.default_stream();
    /// let x = alloc.alloc::<f32>(&s, 32 * 1024).unwrap().with_shape(&[32, 1024]).unwrap();
    /// assert_eq!(x.tensor_meta().unwrap().dtype, "float32");
    /// assert!(alloc.alloc::<f32>(&s, 10).unwrap().with_shape(&[3, 3]).is_err());
    /// ```
    pub fn with_shape(self, shape: &[usize]) -> Result<Self> {
        self.with_tensor_meta(T::DTYPE, shape)
    }

    /// Describes the buffer as a tensor of `dtype` (e.g. `bfloat16` stored as `u16`) and `shape`.
    /// The shape's element count must equal the buffer's length.
    pub fn with_tensor_meta(self, dtype: &str, shape: &[usize]) -> Result<Self> {
        let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if count != Some(self.len) {
            return Err(UsageError::ShapeMismatch { shape: shape.to_vec(), len: self.len }.into());
        }
        if let Some(b) = self.block() {
            let meta = TensorMeta { dtype: dtype.to_string(), shape: shape.to_vec() };
            self.shared().lock().heap.set_tensor_meta(b, meta);
            self.flags.fetch_or(DESCRIBED, Ordering::Relaxed);
        }
        Ok(self)
    }

    /// A handle to the allocator this buffer came from, for growing or replacing it (a KV
    /// cache) without carrying the allocator around. The buffer's [`stream`](Self::stream) is
    /// the stream it was allocated on.
    pub fn allocator(&self) -> super::CachingAllocator {
        let ptr = self.shared.as_ptr().cast_const();
        // SAFETY: `ptr` is the `Arc<Shared>` allocation the buffer's allocator was made from;
        // this live buffer keeps it alive (`keepalive` is set while it is counted), so adding a
        // strong reference and wrapping it is sound. The new handle counts as a handle in the
        // keep-alive protocol (`Locked`): made while a buffer exists, it cannot race a decision
        // to drop `keepalive`, which needs `buffers == 0`.
        let shared = unsafe {
            std::sync::Arc::increment_strong_count(ptr);
            std::sync::Arc::from_raw(ptr)
        };
        super::CachingAllocator { shared: std::mem::ManuallyDrop::new(shared) }
    }

    /// The tensor description set with [`with_shape`](Self::with_shape), if any.
    pub fn tensor_meta(&self) -> Option<TensorMeta> {
        let b = self.block()?;
        self.shared().lock_as_is().heap.tensor_meta(b)
    }

    fn host_ptr(&self) -> Result<*mut T> {
        if self.len == 0 {
            return Ok(std::ptr::NonNull::dangling().as_ptr());
        }
        self.shared().backend.host_ptr(self.addr).map(|p| p.cast::<T>()).ok_or_else(|| {
            Error::from(UsageError::NotHostAddressable {
                backend: self.shared().backend.name().to_string(),
                can_copy: true,
            })
        })
    }

    /// The contents as a slice, on backends whose memory lives in this process.
    pub fn as_host_slice(&self) -> Result<&[T]> {
        let p = self.host_ptr()?;
        // SAFETY: `p` points at this buffer's block, which holds at least `len * size_of::<T>()`
        // initialized bytes and is aligned to 512 bytes (the `Backend` contract on `host_ptr`,
        // blocks being 512-aligned), so to `T` (`alloc` refuses types aligned to more), and is
        // not handed to any other buffer while `self` lives. `T: Pod` accepts any bytes.
        // Shared access is tied to `&self`; writes need `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(p, self.len) })
    }

    /// The contents as a mutable slice, on backends whose memory lives in this process.
    pub fn as_host_slice_mut(&mut self) -> Result<&mut [T]> {
        let p = self.host_ptr()?;
        // SAFETY: as in `as_host_slice`; `&mut self` makes this the only access.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, self.len) })
    }

    /// Copies `src` into the buffer; `src` must have exactly [`len`](Self::len) elements. On
    /// device backends (CUDA) the copy runs in order on the buffer's stream, after the work
    /// queued there (a kernel of the block's previous owner included), and is complete when
    /// this returns.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(UsageError::LengthMismatch { source: src.len(), destination: self.len }.into());
        }
        if self.len == 0 || self.shared().backend.host_ptr(self.addr).is_some() {
            self.as_host_slice_mut()?.copy_from_slice(src);
            return Ok(());
        }
        // SAFETY: `T: Pod` has no padding, so its values are plain initialized bytes.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src)) };
        self.shared().backend.copy_to_device(self.stream.raw, self.addr, bytes).map_err(|e| self.not_addressable(e))
    }

    /// Copies the contents out. On device backends (CUDA) the copy runs in order on the
    /// buffer's stream, so it sees the work queued there (kernels writing the buffer), and is
    /// complete when this returns. Work on other streams is not waited for: order it with
    /// the buffer's stream first, as for any stream-ordered memory.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        if self.len == 0 || self.shared().backend.host_ptr(self.addr).is_some() {
            return Ok(self.as_host_slice()?.to_vec());
        }
        let size = std::mem::size_of::<T>();
        let mut bytes = vec![0u8; self.len * size];
        self.shared()
            .backend
            .copy_from_device(self.stream.raw, self.addr, &mut bytes)
            .map_err(|e| self.not_addressable(e))?;
        // SAFETY: `bytes` holds `len` values' worth of bytes and `T: Pod` accepts any bit
        // pattern; unaligned reads because a `Vec<u8>` is only byte-aligned.
        Ok((0..self.len).map(|i| unsafe { bytes.as_ptr().add(i * size).cast::<T>().read_unaligned() }).collect())
    }

    fn not_addressable(&self, e: crate::error::BackendError) -> Error {
        match e {
            crate::error::BackendError::Unsupported(_) => Error::from(UsageError::NotHostAddressable {
                backend: self.shared().backend.name().to_string(),
                can_copy: false,
            }),
            other => Error::Backend(other),
        }
    }
}

impl<T> Buffer<T> {
    pub(crate) fn block(&self) -> Option<BlockId> {
        self.block
    }

    pub(crate) fn shared(&self) -> &Shared {
        // SAFETY: a live buffer is counted in its allocator's `buffers`, which keeps the
        // allocator's shared state alive (see `Locked`).
        unsafe { self.shared.as_ref() }
    }
}

// SAFETY: a buffer is a handle to a block; `Shared` is `Send + Sync` (its state is behind a
// mutex), and element access follows Rust's borrow rules through `&self` / `&mut self`.
unsafe impl<T: Send> Send for Buffer<T> {}
// SAFETY: as above; `&Buffer<T>` gives only shared reads of `T`.
unsafe impl<T: Sync> Sync for Buffer<T> {}

impl<T> Buffer<T> {
    /// The block is used on `stream` too (`record_stream`): its free must wait for that
    /// stream's work if it is another, which the heap sees to (see `flags`).
    pub(crate) fn note_use(&self, stream: super::ids::StreamId) {
        if stream != self.stream.id {
            self.flags.fetch_or(USED_ELSEWHERE, Ordering::Relaxed);
        }
    }

    /// What parking its block needs, unless the heap must see its free.
    fn parkable(&mut self) -> Option<Parked> {
        let flags = *self.flags.get_mut();
        if flags & NOT_PARKED != 0 {
            return None;
        }
        Some(Parked {
            block: self.block?,
            addr: self.addr,
            requested: self.len as u64 * std::mem::size_of::<T>() as u64,
            stream: self.stream.id,
            class: BlockClass {
                size: u64::from(self.units) * MIN_UNIT,
                pool: if flags & LARGE != 0 { super::Pool::Large } else { super::Pool::Small },
                oversize: flags & OVERSIZE != 0,
                reusable: flags & REUSABLE != 0,
            },
        })
    }
}

impl<T> Drop for Buffer<T> {
    fn drop(&mut self) {
        let parkable = self.parkable();
        let waits = *self.flags.get_mut() & USED_ELSEWHERE != 0;
        // SAFETY: `self.shared` comes from this live buffer, which is never used again.
        unsafe { Shared::release_buffer(self.shared, self.block, parkable, waits) };
    }
}

/// `Buffer<T>` wherever `cudarc` takes device memory: `memcpy_htod`, `memcpy_dtoh`,
/// `clone_dtoh`, kernel launches (`builder.arg(&buf)`), and libraries built on these traits.
///
/// Who keeps ordering correct: a buffer belongs to the stream it was allocated on. When cudarc
/// asks for its pointer for a copy on another stream (`DevicePtr`, `DevicePtrMut`), that stream
/// is made to wait (an event recorded on the buffer's stream) before the copy. A kernel argument
/// is only the address: launch on the buffer's stream, or order the launch yourself. When work
/// on another stream still uses
/// the buffer at drop time, tell the allocator with
/// [`CachingAllocator::record_stream`](crate::CachingAllocator::record_stream), or the block may
/// be reused on its own stream before that work is done. These traits are for buffers of the
/// CUDA backend: using one from another backend with cudarc panics with a message saying so.
#[cfg(feature = "cuda-backend")]
mod cuda_traits {
    use super::Buffer;
    use cudarc::driver::{
        sys, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop,
    };
    use std::sync::Arc;

    impl<T> DeviceSlice<T> for Buffer<T> {
        fn len(&self) -> usize {
            self.len
        }

        fn stream(&self) -> &Arc<CudaStream> {
            self.cuda_stream.get_or_init(|| {
                self.shared().backend.cuda_stream(self.stream.raw).unwrap_or_else(|| {
                    panic!(
                        "a vramscope buffer of the {} backend was used as CUDA memory; only buffers of the CUDA backend can be",
                        self.shared().backend.name()
                    )
                })
            })
        }
    }

    impl<T> Buffer<T> {
        /// Makes `stream` wait for the work queued so far on the buffer's own stream.
        fn order_after_own_stream(&self, stream: &CudaStream) {
            let own = DeviceSlice::stream(self);
            if own.cu_stream() != stream.cu_stream() {
                let ctx = stream.context();
                match own.record_event(None) {
                    Ok(ev) => ctx.record_err(stream.wait(&ev)),
                    Err(e) => ctx.record_err::<()>(Err(e)),
                }
            }
        }
    }

    impl<T> DevicePtr<T> for Buffer<T> {
        fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
            self.order_after_own_stream(stream);
            (self.addr, SyncOnDrop::Sync(None))
        }
    }

    impl<T> DevicePtrMut<T> for Buffer<T> {
        fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
            self.order_after_own_stream(stream);
            (self.addr, SyncOnDrop::Sync(None))
        }
    }

    // SAFETY: the argument pushed is a reference to the buffer's device address (a `u64` field
    // that lives as long as the borrow of the buffer), exactly what a kernel's pointer
    // parameter expects, as cudarc does for its own slices.
    unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b Buffer<T>> for LaunchArgs<'a> {
        fn arg(&mut self, arg: &'b Buffer<T>) -> &mut Self {
            self.arg(&arg.addr)
        }
    }

    // SAFETY: as above, for a buffer the kernel writes.
    unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut Buffer<T>> for LaunchArgs<'a> {
        fn arg(&mut self, arg: &'b mut Buffer<T>) -> &mut Self {
            self.arg(&arg.addr)
        }
    }
}
