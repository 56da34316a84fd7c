//! Devices.
pub mod console;
pub mod klog;
pub mod qemu;
pub mod virtio_console;
