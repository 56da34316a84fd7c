//! KFENCE compiled out (feature `kfence` off): the calls the cache and
//! kmalloc paths make, as empty inline stubs (Linux's `!CONFIG_KFENCE`
//! stubs in `include/linux/kfence.h`). The sampled alloc and free are
//! not stubbed: their call sites are compiled out with the feature.

use crate::allocator::Kmem;
use crate::cache::KfenceOwner;
use crate::platform::Platform;

impl<P: Platform> Kmem<P> {
    #[cfg(feature = "leak-scan")]
    #[inline(always)]
    pub(crate) fn kfence_contains(&self, _addr: usize) -> bool {
        false
    }

    #[cfg(feature = "leak-scan")]
    #[inline(always)]
    pub(crate) fn kfence_for_each_sample(
        &self,
        _f: impl FnMut(usize, usize, usize, Option<crate::alloc_tag::AllocTagRef>),
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
    pub(crate) fn kfence_whatis(&self, _addr: usize) -> Option<crate::verify::WhatIs<P>> {
        None
    }

    #[inline(always)]
    pub(crate) fn kfence_ksize(&self, _addr: usize) -> Option<usize> {
        None
    }
}

/// The cache's KFENCE hook: the clock check, empty.
impl<P: Platform> KfenceOwner<P> for Kmem<P> {
    #[inline(always)]
    fn kfence_tick(&self) {}
}
