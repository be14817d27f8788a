//! The C allocator's handling of large buffers.
//!
//! glibc serves allocations of 128 KiB and more with their own mmap and unmaps them when they
//! are freed, but after the first such free it raises that threshold to the freed size (up to
//! 32 MiB) and serves later large buffers from its heaps instead, where freed memory stays
//! until everything above it in the heap is freed too. A relay session's buffers are exactly
//! that pattern: a 26 MB message grows through 16 and 32 MiB buffers and left about 50 MB
//! resident per connection that had sent one, until the connection closed (four idle
//! connections: 15 → 116 MB); with the threshold pinned, the same run stays at 16 MB. Pinning
//! it (any explicit M_MMAP_THRESHOLD turns the adjustment off) costs an mmap and page faults
//! per large buffer, which is small beside the fsyncs every message already pays.

/// Pins glibc's mmap threshold at its default, 128 KiB. Call once, first thing in `main`.
/// Nothing to do elsewhere (musl and other allocators do not adjust a threshold).
pub fn return_large_buffers_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; it is called before any thread
        // is started, and an unsupported value makes it return 0 without effect.
        let done = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        debug_assert_eq!(done, 1, "mallopt(M_MMAP_THRESHOLD) refused");
    }
}
