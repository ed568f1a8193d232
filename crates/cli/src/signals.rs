//! Stopping a run cleanly: the first SIGINT, SIGTERM or SIGHUP asks the trainer to stop after
//! the step in progress (the CLI then saves, writes the report and prints the resume command);
//! a second one ends the process at once, with the conventional status 128 + signal. The first
//! is acknowledged on stderr at once, so the user knows the run heard it and how to force it.
//!
//! `headroom data prepare` installs the same handlers with its own acknowledgement: it stops
//! at the next piece and removes its unfinished token file.
//!
//! Not for: what is saved (the trainer) or the broken-pipe policy (`main`).

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::flag;
use signal_hook::iterator::Signals;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The signals that stop a run.
const STOPPING: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// Handlers installed for the stopping signals.
#[derive(Debug, Clone)]
pub struct StopSignals {
    /// Set by the first signal; the trainer polls it between steps.
    pub requested: Arc<AtomicBool>,
    received: Arc<AtomicUsize>,
}

impl StopSignals {
    /// The handlers of a training run.
    pub fn install() -> std::io::Result<StopSignals> {
        StopSignals::install_acknowledging(
            "finishing the step in progress, then saving (send it again to stop at once, without saving)",
        )
    }

    /// The handlers, the first signal acknowledged on stderr as "headroom: SIGNAL received:
    /// `acknowledgement`".
    pub fn install_acknowledging(acknowledgement: &'static str) -> std::io::Result<StopSignals> {
        let requested = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicUsize::new(0));
        for signal in STOPPING {
            // Registered first, so it sees the flag as the previous signal left it.
            flag::register_conditional_shutdown(signal, 128 + signal, Arc::clone(&requested))?;
            flag::register(signal, Arc::clone(&requested))?;
            flag::register_usize(signal, Arc::clone(&received), signal as usize)?;
        }
        let mut acknowledged = Signals::new(STOPPING)?;
        std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                if let Some(signal) = acknowledged.forever().next() {
                    eprintln!("headroom: {} received: {acknowledgement}", name(signal));
                }
            })?;
        Ok(StopSignals {
            requested,
            received,
        })
    }

    /// The signal that asked the run to stop, if one did.
    pub fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

/// The signal's usual name.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// A run stopped by a signal after saving: the process exits with 128 + the signal's number.
#[derive(Debug)]
pub struct Interrupted {
    pub signal: i32,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", name(self.signal))
    }
}

impl std::error::Error for Interrupted {}

impl Interrupted {
    /// The conventional exit status.
    pub fn exit_code(&self) -> u8 {
        (128 + self.signal).clamp(0, 255) as u8
    }
}
