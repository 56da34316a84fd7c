//! Layout: how memory is laid out, below every layer that uses it. It
//! imports nothing above itself (only [`crate::platform`], [`crate::sync`],
//! [`crate::error`] and [`crate::flags`]).
//!
//! - [`geometry`]: a cache's slab geometry (small or bufctl slabs, objects
//!   per slab, pages per slab, header on or off slab), the slab header's
//!   and bufctl's sizes;
//! - [`freelist`]: the hardened free list threaded through a small slab's
//!   free objects, and its free map;
//! - [`hash`]: the address hash of the bufctl hash and the trace table;
//! - [`pagemap`]: the page map, one typed entry per page of the primary
//!   source ([`pagemap::PageEntry`]).

pub(crate) mod freelist;
pub(crate) mod geometry;
pub(crate) mod hash;
pub(crate) mod pagemap;
