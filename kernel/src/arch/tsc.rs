//! The time-stamp counter, calibrated once at boot, for short busy-wait
//! delays (the INIT–SIPI–SIPI waits) and for turning cycle counts into
//! time (timestats, kmemtrace, allocinfo, the shell).
//!
//! # Where the rate comes from
//!
//! In order of trust, the first that is present:
//!
//! 1. **The hypervisor's timing leaf** (CPUID `0x4000_0010`, EAX = TSC
//!    kHz; VMware's convention, also KVM's with `vmware-cpuid-freq`): the
//!    rate the hypervisor gives the guest, exact.
//! 2. **CPUID leaf `0x15`** (TSC/crystal ratio and crystal Hz, Intel since
//!    Skylake): exact, as Linux's `native_calibrate_tsc` takes it.
//! 3. **The ACPI PM timer** (FADT `PM_TMR_BLK`, 3.579545 MHz, 24 or 32
//!    bits): TSC cycles counted over about [`CALIBRATION_MS`] of it.
//! 4. **PIT channel 2** (1.193182 MHz, read back with the latch command;
//!    the speaker stays off): the same measurement, when there is no PM
//!    timer.
//!
//! Each end of a measured window is a read of the reference counter
//! between two TSC reads ([`Sample`]; Linux's `tsc_read_refs` does the
//! same against SMIs): the cycle count uses the midpoints and its error is
//! bounded by the two brackets' widths, which the calibration reports. A
//! window whose bound is worse than [`MAX_ERROR_PPM`] is measured again.
//!
//! # Why not the PIT's terminal count (the old way)
//!
//! Counting TSC cycles until PIT channel 2's output rises (mode 0) assumes
//! the guest sees the rise when it happens. Under QEMU TCG a vCPU thread
//! shares the host with others and can be descheduled for milliseconds;
//! everything it misses is counted as if it were inside the 10 ms window.
//! On the 2-core CI VM (host TSC 2596.1 MHz, QEMU 7.2, `-accel tcg`) one
//! boot measured 2.60, 3.20 and 3.56 GHz over three 10 ms windows (3.23 GHz
//! for the boot calibration; 4.5–7.7 GHz in earlier sessions on a busy
//! host). With bracketed reads, three 10 ms windows each: the PM timer
//! 2596.098, 2596.097, 2596.124 MHz (bounds 30–34 ppm), the PIT read back
//! 2596.101, 2596.019, 2596.215 MHz (88–100 ppm); over 1 s the TSC and the
//! PM timer agree to 1 ppm (2596.121–2596.122 MHz; Linux on the host:
//! "tsc: Detected 2596.122 MHz").
//! Under TCG neither CPUID source is present (basic leaves end at `0xd`,
//! the hypervisor leaves at `0x4000_0001`, signature `TCGTCGTCGTCG`).
//!
//! Under TCG the TSC is the host's (QEMU's `cpu_get_ticks`), so figures in
//! cycles are host cycles and times are host (wall-clock) time.

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

use spin::Once;
use x86_64::instructions::port::Port;

use super::rdtsc;

/// PIT input clock in Hz.
pub const PIT_HZ: u64 = 1_193_182;
/// Length of one measured calibration window, in milliseconds.
pub const CALIBRATION_MS: u64 = 10;
/// Windows measured at most before the best one is taken.
const MAX_WINDOWS: usize = 5;
/// A window's error bound accepted at once (parts per million: 0.1 %).
pub const MAX_ERROR_PPM: u64 = 1_000;
/// Tries for one bracketed read before the narrowest is taken.
const SAMPLE_TRIES: usize = 8;
/// Assumed TSC rate before calibration (and if it fails): 1 GHz.
const DEFAULT_TSC_KHZ: u64 = 1_000_000;

static TSC_KHZ: AtomicU64 = AtomicU64::new(0);
static CALIBRATION: Once<Calibration> = Once::new();

/// Where a calibration's rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// CPUID `0x4000_0010` EAX (the hypervisor's TSC kHz).
    HypervisorLeaf,
    /// CPUID `0x15` (crystal Hz × EBX / EAX).
    Cpuid15,
    /// Measured against the ACPI PM timer.
    PmTimer,
    /// Measured against PIT channel 2.
    Pit,
    /// Nothing worked: [`DEFAULT_TSC_KHZ`] assumed.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::HypervisorLeaf => "CPUID 0x40000010 (hypervisor)",
            Self::Cpuid15 => "CPUID 0x15 (crystal ratio)",
            Self::PmTimer => "ACPI PM timer",
            Self::Pit => "PIT channel 2",
            Self::Default => "none (assumed)",
        })
    }
}

/// The result of [`calibrate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    /// TSC ticks per millisecond.
    pub khz: u64,
    /// Where `khz` came from.
    pub source: Source,
    /// Bound on the measurement's relative error, parts per million (0 for
    /// the CPUID sources, which are exact by definition).
    pub error_ppm: u64,
    /// Windows measured (0 for the CPUID sources).
    pub nr_windows: usize,
}

impl fmt::Display for Calibration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TSC {}.{:03} MHz from {}",
            self.khz / 1000,
            self.khz % 1000,
            self.source
        )?;
        if self.nr_windows > 0 {
            write!(
                f,
                " ({} window(s) of {CALIBRATION_MS} ms, within {} ppm)",
                self.nr_windows, self.error_ppm
            )?;
        }
        Ok(())
    }
}

/// Calibrates the TSC once (later calls return the first result) and logs
/// the source and rate. Called on the boot CPU right after `acpi::init`
/// (the PM timer's port comes from the FADT), before anything turns
/// cycles into time.
pub fn calibrate() -> Calibration {
    *CALIBRATION.call_once(|| {
        let calibration = from_cpuid()
            .or_else(|| super::acpi::pm_timer().and_then(|timer| measure(&PmTimerRef(timer))))
            .or_else(|| measure(&PitRef::start()))
            .unwrap_or(Calibration {
                khz: DEFAULT_TSC_KHZ,
                source: Source::Default,
                error_ppm: 0,
                nr_windows: 0,
            });
        TSC_KHZ.store(calibration.khz, Ordering::Relaxed);
        // Post-mortem readers convert the allocator's timestamps with it.
        magpie_slab::descriptor::set_clock_khz(calibration.khz);
        if calibration.source == Source::Default {
            log::warn!("TSC calibration failed: assuming 1 GHz");
        } else {
            log::info!("{calibration}");
        }
        calibration
    })
}

/// The boot calibration, once [`calibrate`] has run.
pub fn calibration() -> Option<Calibration> {
    CALIBRATION.get().copied()
}

/// The CPUID registers the CPUID sources read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuidTiming {
    /// Highest basic leaf (CPUID 0 EAX).
    pub max_basic: u32,
    /// Leaf `0x15`: EAX (denominator), EBX (numerator), ECX (crystal Hz).
    pub leaf_15: [u32; 3],
    /// Whether CPUID 1 ECX bit 31 (a hypervisor is present) is set.
    pub hypervisor: bool,
    /// Highest hypervisor leaf (CPUID `0x4000_0000` EAX).
    pub max_hypervisor: u32,
    /// CPUID `0x4000_0010` EAX (TSC kHz).
    pub leaf_4000_0010_eax: u32,
}

impl CpuidTiming {
    /// Reads the leaves on this CPU (a leaf beyond the maximum reads 0).
    pub fn read() -> Self {
        use core::arch::x86_64::__cpuid;
        let max_basic = __cpuid(0).eax;
        let leaf_15 = if max_basic >= 0x15 {
            let leaf = __cpuid(0x15);
            [leaf.eax, leaf.ebx, leaf.ecx]
        } else {
            [0; 3]
        };
        let hypervisor = __cpuid(1).ecx & (1 << 31) != 0;
        let max_hypervisor = if hypervisor {
            __cpuid(0x4000_0000).eax
        } else {
            0
        };
        let leaf_4000_0010_eax = if (0x4000_0010..0x4001_0000).contains(&max_hypervisor) {
            __cpuid(0x4000_0010).eax
        } else {
            0
        };
        Self {
            max_basic,
            leaf_15,
            hypervisor,
            max_hypervisor,
            leaf_4000_0010_eax,
        }
    }

    /// The TSC rate these leaves state, in kHz, and which leaf states it;
    /// `None` when neither does (a zero field means "not enumerated").
    pub fn tsc_khz(&self) -> Option<(u64, Source)> {
        if self.hypervisor
            && (0x4000_0010..0x4001_0000).contains(&self.max_hypervisor)
            && self.leaf_4000_0010_eax != 0
        {
            return Some((u64::from(self.leaf_4000_0010_eax), Source::HypervisorLeaf));
        }
        let [denominator, numerator, crystal_hz] = self.leaf_15;
        if self.max_basic >= 0x15 && denominator != 0 && numerator != 0 && crystal_hz != 0 {
            let hz = u64::from(crystal_hz) * u64::from(numerator) / u64::from(denominator);
            return Some((hz / 1000, Source::Cpuid15));
        }
        None
    }
}

fn from_cpuid() -> Option<Calibration> {
    let (khz, source) = CpuidTiming::read().tsc_khz()?;
    Some(Calibration {
        khz,
        source,
        error_ppm: 0,
        nr_windows: 0,
    })
}

/// A fixed-rate counter to measure the TSC against.
pub trait Reference {
    /// Counts per second.
    const HZ: u64;
    /// The source a calibration against it reports.
    const SOURCE: Source;
    /// The counter's significant bits, as a mask (it wraps there).
    fn mask(&self) -> u32;
    /// Reads the counter (counting up).
    fn read(&self) -> u32;
}

/// One read of a reference counter between two TSC reads.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// The reference's count.
    pub count: u32,
    /// The TSC halfway between the two reads around it.
    pub tsc: u64,
    /// TSC cycles between those two reads: the reference was read at
    /// `tsc ± width / 2`.
    pub width: u64,
}

/// The narrowest of [`SAMPLE_TRIES`] bracketed reads of `reference`.
pub fn sample<R: Reference>(reference: &R) -> Sample {
    let read = || {
        let before = rdtsc();
        let count = reference.read();
        let after = rdtsc();
        let width = after.wrapping_sub(before);
        Sample {
            count,
            tsc: before + width / 2,
            width,
        }
    };
    (1..SAMPLE_TRIES).fold(read(), |best, _| {
        let this = read();
        if this.width < best.width { this } else { best }
    })
}

/// TSC rate over one window of about [`CALIBRATION_MS`] of `reference`:
/// kHz and the error bound in ppm.
fn window<R: Reference>(reference: &R) -> Option<(u64, u64)> {
    let mask = reference.mask();
    let want = R::HZ * CALIBRATION_MS / 1000;
    let start = sample(reference);
    let mut spins = 0u64;
    while u64::from(reference.read().wrapping_sub(start.count) & mask) < want {
        spins += 1;
        if spins > 100_000_000 {
            return None;
        }
        core::hint::spin_loop();
    }
    let end = sample(reference);
    let ticks = u64::from(end.count.wrapping_sub(start.count) & mask);
    let cycles = end.tsc.checked_sub(start.tsc)?;
    if ticks == 0 || cycles == 0 {
        return None;
    }
    let khz = u128::from(cycles) * u128::from(R::HZ) / u128::from(ticks) / 1000;
    // Each end is off by at most half its bracket, plus one reference
    // tick (the count is read somewhere inside a tick).
    let error_cycles = (start.width + end.width) / 2;
    let error_ppm =
        (u128::from(error_cycles) * 1_000_000 / u128::from(cycles)) as u64 + 1_000_000 / ticks;
    Some((u64::try_from(khz).ok()?.max(1), error_ppm))
}

/// Up to [`MAX_WINDOWS`] windows against `reference`, stopping at the
/// first within [`MAX_ERROR_PPM`]; the one with the smallest bound.
pub fn measure<R: Reference>(reference: &R) -> Option<Calibration> {
    let _irq = super::IrqGuard::new();
    let mut best: Option<Calibration> = None;
    let mut nr_windows = 0;
    while nr_windows < MAX_WINDOWS {
        let Some((khz, error_ppm)) = window(reference) else {
            break;
        };
        nr_windows += 1;
        if best.is_none_or(|best| error_ppm < best.error_ppm) {
            best = Some(Calibration {
                khz,
                source: R::SOURCE,
                error_ppm,
                nr_windows: 0,
            });
        }
        if error_ppm <= MAX_ERROR_PPM {
            break;
        }
    }
    best.map(|best| Calibration { nr_windows, ..best })
}

/// The ACPI PM timer as a [`Reference`].
pub struct PmTimerRef(pub super::acpi::PmTimer);

impl Reference for PmTimerRef {
    const HZ: u64 = super::acpi::PM_TIMER_HZ;
    const SOURCE: Source = Source::PmTimer;

    fn mask(&self) -> u32 {
        if self.0.is_32_bit {
            u32::MAX
        } else {
            0x00ff_ffff
        }
    }

    fn read(&self) -> u32 {
        // SAFETY: the FADT names this I/O port as the PM timer's counter;
        // reading it has no side effect.
        unsafe { Port::<u32>::new(self.0.port).read() & self.mask() }
    }
}

/// PIT channel 2 counting down from 0x10000 in mode 2, as a
/// [`Reference`] counting up. The speaker output stays off.
pub struct PitRef(());

impl PitRef {
    /// Starts channel 2: gate high, speaker off, mode 2 (rate generator),
    /// reload 0 (= 65536 counts, 55 ms per turn).
    pub fn start() -> Self {
        // SAFETY: ports 0x61 (gate and speaker bits), 0x43 (PIT command)
        // and 0x42 (channel 2) are used by nothing else in this kernel;
        // channel 2 drives only the speaker, whose data bit (1) is cleared.
        unsafe {
            let mut gate = Port::<u8>::new(0x61);
            let value = gate.read();
            gate.write((value & !0x02) | 0x01);
            // Channel 2, lobyte/hibyte, mode 2, binary.
            Port::<u8>::new(0x43).write(0b1011_0100);
            let mut channel2 = Port::<u8>::new(0x42);
            channel2.write(0);
            channel2.write(0);
        }
        Self(())
    }
}

impl Reference for PitRef {
    const HZ: u64 = PIT_HZ;
    const SOURCE: Source = Source::Pit;

    fn mask(&self) -> u32 {
        0xffff
    }

    fn read(&self) -> u32 {
        // SAFETY: as in `start`; the latch command (counter latch, channel
        // 2) freezes the count for the two byte reads.
        let count = unsafe {
            Port::<u8>::new(0x43).write(0b1000_0000);
            let mut channel2 = Port::<u8>::new(0x42);
            let low = channel2.read();
            let high = channel2.read();
            u16::from_le_bytes([low, high])
        };
        u32::from(0u16.wrapping_sub(count))
    }
}

/// TSC ticks per millisecond (1 GHz until [`calibrate`] has run).
pub fn khz() -> u64 {
    match TSC_KHZ.load(Ordering::Relaxed) {
        0 => DEFAULT_TSC_KHZ,
        khz => khz,
    }
}

/// Busy-waits at least `microseconds`.
pub fn delay_us(microseconds: u64) {
    let ticks = khz() * microseconds / 1000;
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < ticks {
        core::hint::spin_loop();
    }
}

/// Nanoseconds in `cycles` TSC ticks (and, for a TSC reading, nanoseconds
/// since the TSC started: boot).
pub fn cycles_to_ns(cycles: u64) -> u64 {
    (u128::from(cycles) * 1_000_000 / u128::from(khz())) as u64
}

/// Microseconds in `cycles` TSC ticks.
pub fn cycles_to_us(cycles: u64) -> u64 {
    cycles.saturating_mul(1000) / khz()
}
