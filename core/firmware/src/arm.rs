//! Cortex-M: entry, SysTick, semihosting exit, fault handlers.
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::{entry, exception, ExceptionFrame};
use cortex_m_semihosting::debug::{self, EXIT_FAILURE, EXIT_SUCCESS};

pub(crate) use cortex_m_semihosting::hprintln as println;

/// The core clock that QEMU's SysTick counts: 16 MHz on the micro:bit (nRF51), 25 MHz on the
/// MPS2 AN386.
#[cfg(target_has_atomic = "ptr")]
const CORE_HZ: u32 = 25_000_000;
#[cfg(not(target_has_atomic = "ptr"))]
const CORE_HZ: u32 = 16_000_000;

#[entry]
fn main() -> ! {
    crate::firmware_main()
}

/// Starts SysTick at `hz` with its interrupt enabled.
pub fn start_timer(hz: u32) {
    // SAFETY: SYST is used only here and in `stop_timer`, both from the main loop.
    let mut syst = unsafe { cortex_m::Peripherals::steal() }.SYST;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(CORE_HZ / hz - 1);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
}

/// Stops SysTick and its interrupt.
pub fn stop_timer() {
    // SAFETY: see `start_timer`.
    let mut syst = unsafe { cortex_m::Peripherals::steal() }.SYST;
    syst.disable_interrupt();
    syst.disable_counter();
}

/// Ends the QEMU run with the verdict as its exit status (0 or 1).
pub fn exit(ok: bool) -> ! {
    debug::exit(if ok { EXIT_SUCCESS } else { EXIT_FAILURE });
    loop {
        cortex_m::asm::bkpt();
    }
}

#[exception]
fn SysTick() {
    crate::on_tick();
}

// cortex-m-rt's defaults loop forever: a fault must end the run with a failure instead.
#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    println!(
        "keyserial firmware: FAILED: HardFault at pc {:#010x}",
        frame.pc()
    );
    exit(false)
}

#[exception]
unsafe fn DefaultHandler(irqn: i16) {
    println!(
        "keyserial firmware: FAILED: unexpected exception or interrupt {}",
        irqn
    );
    exit(false)
}
