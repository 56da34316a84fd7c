//! Devices: the serial console (and `print!`), the `log` backend that
//! prints through it, QEMU's exit device, and the virtio console kmemtrace
//! dumps go out on. Imports `arch` and `mm` only.

pub mod console;
pub mod klog;
pub mod qemu;
pub mod virtio_console;
