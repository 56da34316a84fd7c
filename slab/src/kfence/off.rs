//! KFENCE compiled out (feature `kfence` off): the calls the cache and
//! kmalloc paths make, as empty inline stubs (Linux's `!CONFIG_KFENCE`
//! stubs in `include/linux/kfence.h`). Nothing arms a sample, so the
//! `SAMPLE` hot flag is never set and the hits never reach them; the
//! free's slow path asks `kfence_free` and gets `None` (not ours).

use core::ptr::NonNull;

use crate::alloc_tag::AllocTagRef;
use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::error::FreeError;
use crate::platform::Platform;

impl<P: Platform> Kmem<P> {
    #[inline(always)]
    pub(crate) fn kfence_contains(&self, _addr: usize) -> bool {
        false
    }

    #[inline(always)]
    pub(crate) fn kfence_tick(&self) {}

    #[cfg(feature = "leak-scan")]
    #[inline(always)]
    pub(crate) fn kfence_for_each_sample(
        &self,
        _f: impl FnMut(usize, usize, usize, Option<AllocTagRef>),
    ) {
    }

    /// Never called: there are no samples.
    #[cfg(feature = "leak-scan")]
    #[inline(always)]
    pub(crate) fn kfence_read_sample(
        &self,
        _addr: usize,
        _from: usize,
        _out: &mut [usize],
    ) -> bool {
        false
    }

    #[inline(always)]
    pub(crate) fn kfence_alloc(
        &self,
        _cache: &KmemCache<P>,
        _size: usize,
        _tag: impl Fn() -> Option<AllocTagRef>,
    ) -> Option<NonNull<u8>> {
        None
    }

    #[inline(always)]
    pub(crate) fn kfence_whatis(&self, _addr: usize) -> Option<crate::verify::WhatIs<P>> {
        None
    }

    #[inline(always)]
    pub(crate) fn kfence_ksize(&self, _addr: usize) -> Option<usize> {
        None
    }

    #[inline(always)]
    pub(crate) fn kfence_free(
        &self,
        _addr: usize,
        _cache: Option<&KmemCache<P>>,
    ) -> Option<Result<(), FreeError>> {
        None
    }

    /// Never called: `kfence_contains` is false.
    #[inline(always)]
    pub(crate) fn kfree_sampled(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        Err(FreeError::NotAllocated {
            addr: ptr.as_ptr() as usize,
        })
    }
}
