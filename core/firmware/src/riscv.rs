//! RISC-V (QEMU `virt`, machine mode): entry, CLINT machine timer, semihosting exit, trap handlers.
use core::sync::atomic::{AtomicU32, Ordering};

use riscv::interrupt::Interrupt;
use riscv_semihosting::debug::{self, EXIT_FAILURE, EXIT_SUCCESS};

pub(crate) use riscv_semihosting::hprintln as println;

/// The `virt` machine's CLINT: hart 0's `mtimecmp` and the `mtime` counter, ticking at 10 MHz.
const MTIMECMP: usize = 0x0200_4000;
const MTIME: usize = 0x0200_bff8;
const TIMEBASE_HZ: u32 = 10_000_000;

/// Timer ticks between interrupts (set by `start_timer` before the interrupt is enabled).
static PERIOD: AtomicU32 = AtomicU32::new(0);

#[riscv_rt::entry]
fn main() -> ! {
    crate::firmware_main()
}

fn mtime() -> u64 {
    // SAFETY: the CLINT registers of QEMU's `virt` machine; reading hi, lo, hi again gives a
    // consistent 64-bit value.
    unsafe {
        loop {
            let hi = core::ptr::read_volatile((MTIME + 4) as *const u32);
            let lo = core::ptr::read_volatile(MTIME as *const u32);
            if hi == core::ptr::read_volatile((MTIME + 4) as *const u32) {
                return (u64::from(hi) << 32) | u64::from(lo);
            }
        }
    }
}

fn set_mtimecmp(at: u64) {
    // SAFETY: hart 0's `mtimecmp`; raising the high word first never makes the compare value
    // spuriously small in between.
    unsafe {
        core::ptr::write_volatile((MTIMECMP + 4) as *mut u32, u32::MAX);
        core::ptr::write_volatile(MTIMECMP as *mut u32, at as u32);
        core::ptr::write_volatile((MTIMECMP + 4) as *mut u32, (at >> 32) as u32);
    }
}

/// Starts the machine timer interrupt at `hz`.
pub fn start_timer(hz: u32) {
    PERIOD.store(TIMEBASE_HZ / hz, Ordering::Relaxed);
    set_mtimecmp(mtime() + u64::from(PERIOD.load(Ordering::Relaxed)));
    // SAFETY: the handler below is ready and touches only what it is allowed to.
    unsafe {
        riscv::register::mie::set_mtimer();
        riscv::interrupt::enable();
    }
}

/// Stops the machine timer interrupt.
pub fn stop_timer() {
    // SAFETY: masking an interrupt is always sound.
    unsafe { riscv::register::mie::clear_mtimer() };
    set_mtimecmp(u64::MAX);
}

/// Ends the QEMU run with the verdict as its exit status (0 or 1).
pub fn exit(ok: bool) -> ! {
    debug::exit(if ok { EXIT_SUCCESS } else { EXIT_FAILURE });
    loop {
        riscv::asm::wfi();
    }
}

#[riscv_rt::core_interrupt(Interrupt::MachineTimer)]
fn machine_timer() {
    set_mtimecmp(mtime() + u64::from(PERIOD.load(Ordering::Relaxed)));
    crate::on_tick();
}

// riscv-rt's defaults end in a busy loop: a trap must end the run with a failure instead.
#[unsafe(export_name = "ExceptionHandler")]
fn exception_handler(frame: &riscv_rt::TrapFrame) -> ! {
    let _ = frame;
    println!(
        "keyserial firmware: FAILED: exception, mcause {:#x} at mepc {:#010x}",
        riscv::register::mcause::read().bits(),
        riscv::register::mepc::read()
    );
    exit(false)
}

#[unsafe(export_name = "DefaultHandler")]
fn default_handler() {
    println!(
        "keyserial firmware: FAILED: unexpected interrupt, mcause {:#x}",
        riscv::register::mcause::read().bits()
    );
    exit(false)
}
