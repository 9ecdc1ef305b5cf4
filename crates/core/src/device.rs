//! The device ledger of an imported trace: what its device activity (Kineto's kernels, copies
//! and sets) cost per band beside the host's spans, the devices' busy time and the streams'
//! concurrency. Computed by `app::import::device_stats` from a `trace::TraceSummary`, stored in
//! `import.json` and carried by the run's summary, so every rendering and `compare --clock
//! device` read the same figures.

use serde::{Deserialize, Serialize};

use crate::stats::Spread;

/// A trace's device activity beside its host spans. Every figure per step is the median and
/// range over the kept steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Device activities (kernels, copies, sets) launched inside the kept steps.
    pub activities: u64,
    pub devices: usize,
    pub streams: usize,
    /// Per band, host and device time per token, separately: host = the self time of the
    /// band's spans on the CPU threads as read (not scaled to the wall); device = the time of
    /// the activity the band's spans launched (a kernel takes the band of its launch, read
    /// with the launch's enclosing modules, annotations and ops).
    pub bands: Vec<DeviceBand>,
    /// The step span's wall on the host.
    pub step_wall_ms: Spread,
    /// From the step span's start to the later of its end and its last activity's end.
    pub step_wall_with_device_ms: Spread,
    /// The devices' busy time: the union over each device's streams of the step's activity.
    pub busy_ms: Spread,
    /// The sum of the step's activity time (streams running at once each count).
    pub activity_ms: Spread,
    /// Activity time over busy time (1: one stream at a time); steps without activity left
    /// out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_concurrency: Option<Spread>,
    /// Activity whose launch lies outside every step: counted, with its device time, not in
    /// any band.
    pub outside_steps: u64,
    pub outside_steps_ms: f64,
    /// Activity whose launch was never found: counted, with its device time.
    pub unlinked: u64,
    pub unlinked_ms: f64,
    /// Launches let go to bound memory before their activity was read.
    pub links_dropped: u64,
    /// Activity no rule matched (with its launch's context): (name, launched by, device ms per
    /// step).
    pub unassigned: Vec<(String, String, f64)>,
}

/// One band's host and device time per token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceBand {
    pub band: String,
    pub host_ms_per_token: Spread,
    pub device_ms_per_token: Spread,
    /// The device ms/token of every kept step, in the trace's order: the values whose median
    /// and range `device_ms_per_token` is, what `compare --clock device --fail-above` tests.
    /// Empty in runs imported before it was stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_ms_per_token_steps: Vec<f64>,
}

/// Which clock a band's time is read on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// The host's: the spans' (or nodes') time on the CPU, as every measured profile has.
    #[default]
    Host,
    /// The device's: the activity the band's spans launched, on the device's streams.
    Device,
}

impl Clock {
    pub fn name(self) -> &'static str {
        match self {
            Clock::Host => "host",
            Clock::Device => "device",
        }
    }
}

impl DeviceStats {
    /// The bands with time on either clock in some step (a rule set's band nothing fell in,
    /// `moe` in a dense model, is left out as the host's summary leaves it out).
    pub fn bands_with_time(&self) -> impl Iterator<Item = &DeviceBand> + Clone {
        self.bands
            .iter()
            .filter(|b| b.host_ms_per_token.max > 0.0 || b.device_ms_per_token.max > 0.0)
    }

    /// The sum over bands of the device's median ms/token.
    pub fn device_total_ms_per_token(&self) -> f64 {
        self.bands_with_time()
            .map(|b| b.device_ms_per_token.median)
            .filter(|v| v.is_finite())
            .sum()
    }

    /// The sum over bands of the host's median ms/token (self time as read).
    pub fn host_total_ms_per_token(&self) -> f64 {
        self.bands_with_time()
            .map(|b| b.host_ms_per_token.median)
            .filter(|v| v.is_finite())
            .sum()
    }
}
