//! Physical memory.
pub mod boot_info;
pub mod frame;
pub mod layout;
pub mod paging;
pub mod reserved;
