//! The device ledger of an imported trace in every rendering: per band the host's self time and
//! the device's time side by side, the devices' busy time against the activity's sum (stream
//! concurrency), the step's wall on both clocks and the activity outside every step. The table,
//! the lines, the CSV rows and the SQL tables all come from here.

use opledger_core::device::DeviceStats;
use opledger_core::stats::Spread;

use crate::table::{markdown_section, text_section, Align};

pub(crate) const HEADER: [&str; 6] = [
    "band",
    "host ms/token",
    "range (steps)",
    "device ms/token",
    "range (steps)",
    "device share",
];
const ALIGN: [Align; 6] = [
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
];

/// `0.0070`, or "not recorded" for a figure no step had.
fn ms(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "not recorded".into()
    }
}

fn range(s: &Spread) -> String {
    if s.min.is_finite() && s.max.is_finite() {
        format!("{:.4}–{:.4}", s.min, s.max)
    } else {
        String::new()
    }
}

/// `0.0850 [0.0060–0.1640]`.
pub(crate) fn spread(s: &Spread) -> String {
    if s.median.is_finite() {
        format!("{:.4} [{}]", s.median, range(s))
    } else {
        "not recorded".into()
    }
}

/// One row per band, then the total of the medians.
pub(crate) fn rows(d: &DeviceStats) -> Vec<Vec<String>> {
    let total = d.device_total_ms_per_token();
    let mut rows: Vec<Vec<String>> = d
        .bands_with_time()
        .map(|b| {
            let dev = b.device_ms_per_token.median;
            vec![
                b.band.clone(),
                ms(b.host_ms_per_token.median),
                range(&b.host_ms_per_token),
                ms(dev),
                range(&b.device_ms_per_token),
                if total > 0.0 && dev.is_finite() {
                    format!("{:.1} %", dev / total * 100.0)
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    rows.push(vec![
        "total".into(),
        ms(d.host_total_ms_per_token()),
        String::new(),
        ms(total),
        String::new(),
        if total > 0.0 {
            "100.0 %".into()
        } else {
            String::new()
        },
    ]);
    rows
}

/// The line above the table: what the activity is and how many devices and streams ran it.
pub(crate) fn title(d: &DeviceStats) -> String {
    format!(
        "device ledger: {} device activities (kernels, copies, sets) launched in the kept steps, per band the host's self time (spans as read, not scaled to the wall) and the device time of what they launched; medians and ranges over steps",
        d.activities
    )
}

/// The figures under the table.
pub(crate) fn lines(d: &DeviceStats) -> Vec<String> {
    let mut out = vec![
        format!(
            "device busy {} ms a step (the union over each device's streams) against {} ms of activity{}",
            spread(&d.busy_ms),
            spread(&d.activity_ms),
            match &d.stream_concurrency {
                Some(c) => format!(": stream concurrency {}", spread(c)),
                None => ": stream concurrency not recorded (no step had activity)".into(),
            }
        ),
        format!(
            "step wall {} ms on the host, {} ms to its last device activity",
            spread(&d.step_wall_ms),
            spread(&d.step_wall_with_device_ms)
        ),
        // Kineto's trace gives each activity its stream, not a per-stream figure this ledger
        // keeps: the counts are what is recorded
        format!(
            "streams: {} on {} device(s); per-stream time not recorded (busy time is per device, the union of its streams)",
            d.streams, d.devices
        ),
        format!(
            "activity launched outside every step: {} ({:.4} ms, in no band); with no launch found: {} ({:.4} ms){}",
            d.outside_steps,
            d.outside_steps_ms,
            d.unlinked,
            d.unlinked_ms,
            if d.links_dropped > 0 {
                format!("; {} launches let go to bound memory", d.links_dropped)
            } else {
                String::new()
            }
        ),
    ];
    for (name, parent, ms) in &d.unassigned {
        out.push(format!(
            "unassigned device activity: '{name}' launched by '{parent}' {ms:.4} ms per step"
        ));
    }
    out
}

/// The terminal section.
pub fn device_text(d: &DeviceStats) -> String {
    text_section(&title(d), &HEADER, &ALIGN, &rows(d), &lines(d))
}

/// The markdown section.
pub fn device_markdown(d: &DeviceStats) -> String {
    markdown_section("Device", &title(d), &HEADER, &ALIGN, &rows(d), &lines(d))
}

/// `bands.csv`'s rows on the device's clock: the band's device ms/token (median and range over
/// steps) and its share of the device's total; `fused_ms` is the step's wall to its last device
/// activity. Columns the device has no figure for (corrected, nodes, TIMED ms) are empty.
pub(crate) fn csv_rows(d: &DeviceStats, tokens: u32, depth_tokens: u32) -> Vec<Vec<String>> {
    let total = d.device_total_ms_per_token();
    let f = |x: f64| {
        if x.is_finite() {
            format!("{x:.6}")
        } else {
            String::new()
        }
    };
    d.bands_with_time()
        .map(|b| {
            let s = &b.device_ms_per_token;
            vec![
                b.band.clone(),
                f(s.median),
                String::new(),
                f(s.min),
                f(s.max),
                if total > 0.0 {
                    f(s.median / total)
                } else {
                    String::new()
                },
                String::new(),
                String::new(),
                String::new(),
                tokens.to_string(),
                depth_tokens.to_string(),
                f(d.step_wall_with_device_ms.median),
                String::new(),
                "device".into(),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_core::device::DeviceBand;

    fn sp(median: f64, min: f64, max: f64) -> Spread {
        Spread {
            median,
            min,
            max,
            n: 2,
        }
    }

    #[test]
    fn rows_total_the_medians_and_share_the_device_total() {
        let d = DeviceStats {
            activities: 3,
            devices: 1,
            streams: 2,
            bands: vec![
                DeviceBand {
                    band: "attention".into(),
                    host_ms_per_token: sp(0.010, 0.0, 0.020),
                    device_ms_per_token: sp(0.030, 0.0, 0.060),
                    device_ms_per_token_steps: vec![0.0, 0.060],
                },
                DeviceBand {
                    band: "other".into(),
                    host_ms_per_token: sp(0.050, 0.040, 0.060),
                    device_ms_per_token: sp(0.010, 0.010, 0.010),
                    device_ms_per_token_steps: vec![0.010, 0.010],
                },
            ],
            step_wall_ms: sp(0.1, 0.1, 0.1),
            step_wall_with_device_ms: sp(0.12, 0.1, 0.14),
            busy_ms: sp(0.03, 0.01, 0.05),
            activity_ms: sp(0.04, 0.01, 0.07),
            stream_concurrency: None,
            outside_steps: 0,
            outside_steps_ms: 0.0,
            unlinked: 0,
            unlinked_ms: 0.0,
            links_dropped: 0,
            unassigned: Vec::new(),
        };
        let r = rows(&d);
        // device total 0.030 + 0.010 = 0.040: attention 75 %, other 25 %; host 0.060
        assert_eq!(
            r[0],
            [
                "attention",
                "0.0100",
                "0.0000–0.0200",
                "0.0300",
                "0.0000–0.0600",
                "75.0 %"
            ]
        );
        assert_eq!(r[1][5], "25.0 %");
        assert_eq!(r[2], ["total", "0.0600", "", "0.0400", "", "100.0 %"]);
        assert!(lines(&d)[0].ends_with("stream concurrency not recorded (no step had activity)"));
    }
}
