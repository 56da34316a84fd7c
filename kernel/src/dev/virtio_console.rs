//! A transmit-only legacy virtio console (QEMU `virtio-serial-pci` with a
//! `virtconsole` on port 0): the bulk channel for `kmemtrace dump`.
//!
//! QEMU's `isa-debugcon` and 16550 write one byte per guest I/O access, so
//! one `write(2)` per byte into a file chardev: about 360 KiB/s here, three
//! minutes for a million events. A virtqueue hands QEMU 64 KiB per
//! notification, which it writes to the chardev in one call.
//!
//! Legacy (virtio 0.9.5) interface through I/O BAR 0, found by a scan of
//! PCI bus 0 (vendor 0x1af4, device 0x1003). Only the transmit queue of
//! port 0 (queue 1) is set up; no feature is negotiated (so no multiport:
//! port 0 is open from reset). Each send is synchronous: one descriptor,
//! notify, poll the used ring (under TCG the notify is handled inside the
//! port write).

use core::sync::atomic::{Ordering, fence};

use spin::Mutex;
use x86_64::instructions::port::Port;

use crate::mm::{frame, layout};

const VENDOR_VIRTIO: u16 = 0x1af4;
const DEVICE_CONSOLE_LEGACY: u16 = 0x1003;

// Legacy virtio registers (offsets into I/O BAR 0).
const GUEST_FEATURES: u16 = 0x04;
const QUEUE_PFN: u16 = 0x08;
const QUEUE_SIZE: u16 = 0x0c;
const QUEUE_SELECT: u16 = 0x0e;
const QUEUE_NOTIFY: u16 = 0x10;
const DEVICE_STATUS: u16 = 0x12;

const STATUS_ACKNOWLEDGE: u8 = 1;
const STATUS_DRIVER: u8 = 2;
const STATUS_DRIVER_OK: u8 = 4;

/// Port 0's transmit queue.
const TRANSMIT_QUEUE: u16 = 1;
/// Bytes per send (the bounce buffer).
pub const CHUNK_BYTES: usize = 64 * 1024;
const CHUNK_PAGES: usize = CHUNK_BYTES / frame::PAGE_SIZE;
/// Used-ring polls before a send is declared lost.
const MAX_POLLS: usize = 100_000_000;

/// The device, once set up.
struct Console {
    io_base: u16,
    queue_size: u16,
    /// Virtual addresses of the ring parts (direct map).
    descriptors: usize,
    available: usize,
    used: usize,
    /// The bounce buffer: virtual and physical address.
    buffer: usize,
    buffer_phys: u64,
    /// Bytes waiting in the bounce buffer.
    fill: usize,
    next_available: u16,
}

static CONSOLE: Mutex<Option<Console>> = Mutex::new(None);

fn pci_read32(device: u8, offset: u8) -> u32 {
    let address = 0x8000_0000u32 | (u32::from(device) << 11) | u32::from(offset & 0xfc);
    // SAFETY: PCI configuration mechanism #1 (ports 0xcf8/0xcfc), bus 0,
    // function 0; reads have no side effects on the devices we probe.
    unsafe {
        Port::<u32>::new(0xcf8).write(address);
        Port::<u32>::new(0xcfc).read()
    }
}

fn pci_write16(device: u8, offset: u8, value: u16) {
    let address = 0x8000_0000u32 | (u32::from(device) << 11) | u32::from(offset & 0xfc);
    let shift = u32::from(offset & 2) * 8;
    // SAFETY: as in pci_read32; a read-modify-write of one 16-bit field
    // (the command register) of the device we found.
    unsafe {
        Port::<u32>::new(0xcf8).write(address);
        let mut data = Port::<u32>::new(0xcfc);
        let old = data.read();
        data.write((old & !(0xffff << shift)) | (u32::from(value) << shift));
    }
}

/// Finds the device on PCI bus 0 and sets up its transmit queue. Returns
/// false (and sets up nothing) when there is none or it cannot be used.
pub fn init() -> bool {
    let mut console = CONSOLE.lock();
    if console.is_some() {
        return true;
    }
    let Some(device) = (0..32u8).find(|&device| {
        let id = pci_read32(device, 0);
        id & 0xffff == u32::from(VENDOR_VIRTIO) && id >> 16 == u32::from(DEVICE_CONSOLE_LEGACY)
    }) else {
        return false;
    };
    let bar0 = pci_read32(device, 0x10);
    if bar0 & 1 == 0 || bar0 & !3 == 0 {
        log::warn!("virtio console: BAR 0 is not an assigned I/O BAR ({bar0:#x})");
        return false;
    }
    let io_base = (bar0 & 0xfffc) as u16;
    // Command register: I/O space and bus mastering (the device DMAs).
    let command = pci_read32(device, 0x04) as u16;
    pci_write16(device, 0x04, command | 0x1 | 0x4);
    let io = |offset: u16| io_base + offset;
    // SAFETY: the device's own legacy virtio registers (BAR 0, I/O space).
    let queue_size = unsafe {
        Port::<u8>::new(io(DEVICE_STATUS)).write(0);
        Port::<u8>::new(io(DEVICE_STATUS)).write(STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        Port::<u32>::new(io(GUEST_FEATURES)).write(0);
        Port::<u16>::new(io(QUEUE_SELECT)).write(TRANSMIT_QUEUE);
        Port::<u16>::new(io(QUEUE_SIZE)).read()
    };
    if queue_size == 0 || !queue_size.is_power_of_two() {
        log::warn!("virtio console: transmit queue size {queue_size}");
        return false;
    }
    let size = usize::from(queue_size);
    // Legacy layout: descriptors, available ring, then the used ring on the
    // next 4 KiB boundary.
    let used_offset = (16 * size + 6 + 2 * size).next_multiple_of(4096);
    let ring_bytes = used_offset + (6 + 8 * size).next_multiple_of(4096);
    let ring_pages = ring_bytes / frame::PAGE_SIZE;
    // One allocation scope: the queue's rings and the transmit buffer.
    let frames = crate::try_alloc!(frame::alloc_contiguous(ring_pages).ok_or(()).and_then(
        |ring| {
            match frame::alloc_contiguous(CHUNK_PAGES) {
                Some(buffer) => Ok((ring, buffer)),
                None => {
                    frame::free(ring, ring_pages);
                    Err(())
                }
            }
        }
    ));
    let Ok((ring, buffer)) = frames else {
        log::warn!("virtio console: no memory for the transmit queue");
        return false;
    };
    let ring_virt = layout::phys_to_virt(ring.as_u64());
    // SAFETY: fresh frames, ours, mapped in the direct map.
    unsafe { core::ptr::write_bytes(ring_virt as *mut u8, 0, ring_bytes) };
    // SAFETY: as above (the device's registers).
    unsafe {
        Port::<u32>::new(io(QUEUE_PFN)).write((ring.as_u64() >> 12) as u32);
        Port::<u8>::new(io(DEVICE_STATUS))
            .write(STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK);
    }
    *console = Some(Console {
        io_base,
        queue_size,
        descriptors: ring_virt,
        available: ring_virt + 16 * size,
        used: ring_virt + used_offset,
        buffer: layout::phys_to_virt(buffer.as_u64()),
        buffer_phys: buffer.as_u64(),
        fill: 0,
        next_available: 0,
    });
    log::info!("virtio console: PCI 00:{device:02x}.0, I/O {io_base:#x}, queue of {queue_size}");
    true
}

/// Whether the device is set up.
pub fn is_present() -> bool {
    CONSOLE.lock().is_some()
}

/// Queues `bytes` for the host: they go out [`CHUNK_BYTES`] at a time as
/// the bounce buffer fills, the rest on [`flush`]. Returns false if there
/// is no device or it stopped answering.
pub fn write(bytes: &[u8]) -> bool {
    let mut guard = CONSOLE.lock();
    let Some(console) = guard.as_mut() else {
        return false;
    };
    let mut rest = bytes;
    while !rest.is_empty() {
        let take = rest.len().min(CHUNK_BYTES - console.fill);
        // SAFETY: fill + take <= CHUNK_BYTES, inside the bounce buffer,
        // which the device reads only between a notify and its used entry
        // (`send` waits for that).
        unsafe {
            core::ptr::copy_nonoverlapping(
                rest.as_ptr(),
                (console.buffer + console.fill) as *mut u8,
                take,
            )
        };
        console.fill += take;
        rest = &rest[take..];
        if console.fill == CHUNK_BYTES && !console.send() {
            return false;
        }
    }
    true
}

/// Sends what [`write`](fn@write) left in the bounce buffer.
pub fn flush() -> bool {
    let mut guard = CONSOLE.lock();
    match guard.as_mut() {
        Some(console) => console.fill == 0 || console.send(),
        None => false,
    }
}

impl Console {
    /// Sends the bounce buffer's `fill` bytes and waits until the device
    /// has taken them.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "descriptors are 16-aligned (virtio 1.x 2.7.5); their fields at 0, 8, 12, 14 are naturally aligned"
    )]
    fn send(&mut self) -> bool {
        let index = self.next_available;
        let slot = usize::from(index % self.queue_size);
        let len = core::mem::take(&mut self.fill);
        // SAFETY: the ring memory is ours and laid out as computed in
        // `init`; the device reads descriptor 0 and the buffer only after
        // the notify below, and we reuse them only after the used ring says
        // it is done.
        unsafe {
            let descriptor = self.descriptors as *mut u8;
            descriptor.cast::<u64>().write_volatile(self.buffer_phys);
            descriptor.add(8).cast::<u32>().write_volatile(len as u32);
            descriptor.add(12).cast::<u16>().write_volatile(0);
            descriptor.add(14).cast::<u16>().write_volatile(0);
            ((self.available + 4 + 2 * slot) as *mut u16).write_volatile(0);
            fence(Ordering::SeqCst);
            ((self.available + 2) as *mut u16).write_volatile(index.wrapping_add(1));
            fence(Ordering::SeqCst);
            Port::<u16>::new(self.io_base + QUEUE_NOTIFY).write(TRANSMIT_QUEUE);
        }
        self.next_available = index.wrapping_add(1);
        for _ in 0..MAX_POLLS {
            // SAFETY: the used ring's index, written by the device.
            let used = unsafe { ((self.used + 2) as *const u16).read_volatile() };
            if used == self.next_available {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }
}
