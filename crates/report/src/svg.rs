//! Horizontal bar charts as plain SVG text (no fonts or scripts to fetch): a row per band, one or
//! more bars per row, optional range whiskers, panels each with its own scale. Used for a profile's
//! ms/token per band, an A/B's ledger and a waste analysis.

use std::fmt::Write as _;

/// A whole chart.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    /// The axis label (`ms per token`).
    pub unit: String,
    /// Legend entries (name, CSS colour); empty when each bar's colour is its row's.
    pub legend: Vec<(String, String)>,
    pub panels: Vec<Panel>,
}

/// A group of rows under a subtitle.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: Option<String>,
    pub rows: Vec<BarRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BarRow {
    pub label: String,
    pub bars: Vec<Bar>,
    /// Text right of the bars (`0.1389 ms · 1.9 %`).
    pub note: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub value: f64,
    /// CSS colour (`#e4572e`).
    pub colour: String,
    /// A whisker from min to max (the range over cycles).
    pub range: Option<(f64, f64)>,
}

pub use crate::palette::band_colour;

/// Escapes text for XML (and HTML) content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A step of 1, 2 or 5 x 10^k giving about `target` ticks up to `max`.
fn tick_step(max: f64, target: f64) -> f64 {
    let raw = max / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let step = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    step * mag
}

fn fmt_tick(v: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

const WIDTH: f64 = 860.0;
const LABEL_W: f64 = 150.0;
const NOTE_W: f64 = 230.0;
const BAR_H: f64 = 14.0;
const ROW_GAP: f64 = 10.0;
const PANEL_TITLE_H: f64 = 24.0;

/// Renders the chart; finite, non-negative values only (others draw as empty bars). Every panel
/// has its own scale and axis, so a small scenario's bars are not flattened by a large one's.
pub fn bar_chart_svg(chart: &BarChart) -> String {
    let clean = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
    let plot_x = LABEL_W;
    let plot_w = WIDTH - LABEL_W - NOTE_W;

    let mut body = String::new();
    let mut y = 40.0;
    if !chart.legend.is_empty() {
        let mut x = plot_x;
        for (name, colour) in &chart.legend {
            let _ = writeln!(
                body,
                r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
                y - 10.0,
                esc(colour),
                x + 16.0,
                y,
                esc(name)
            );
            x += 28.0 + 7.0 * name.chars().count() as f64;
        }
        y += 14.0;
    }
    for panel in &chart.panels {
        let max = panel
            .rows
            .iter()
            .flat_map(|r| &r.bars)
            .map(|b| clean(b.range.map(|r| r.1).unwrap_or(0.0)).max(clean(b.value)))
            .fold(0.0f64, f64::max);
        let max = if max > 0.0 { max } else { 1.0 };
        let step = tick_step(max, 5.0);
        let axis_max = (max / step).ceil() * step;
        let x_of = |v: f64| plot_x + clean(v) / axis_max * plot_w;
        if let Some(t) = &panel.title {
            y += PANEL_TITLE_H - 6.0;
            let _ = writeln!(
                body,
                r#"<text x="8" y="{y:.1}" font-size="13" font-weight="bold">{}</text>"#,
                esc(t)
            );
            y += 6.0;
        } else {
            y += 6.0;
        }
        let panel_top = y;
        let mut rows = String::new();
        for row in &panel.rows {
            let n = row.bars.len().max(1) as f64;
            let row_h = n * BAR_H + (n - 1.0) * 2.0;
            let _ = writeln!(
                rows,
                r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
                plot_x - 8.0,
                y + row_h / 2.0 + 4.0,
                esc(&row.label)
            );
            let mut by = y;
            for bar in &row.bars {
                let w = x_of(bar.value) - plot_x;
                let _ = writeln!(
                    rows,
                    r#"<rect class="bar" x="{plot_x:.1}" y="{by:.1}" width="{w:.1}" height="{BAR_H:.1}" fill="{}"><title>{} {}</title></rect>"#,
                    esc(&bar.colour),
                    esc(&row.label),
                    if bar.value.is_finite() {
                        format!("{:.4}", bar.value)
                    } else {
                        "n/a".into()
                    }
                );
                if let Some((lo, hi)) = bar.range {
                    let (x0, x1, cy) = (x_of(lo), x_of(hi), by + BAR_H / 2.0);
                    let _ = writeln!(
                        rows,
                        r##"<path d="M{x0:.1},{cy:.1}H{x1:.1}M{x0:.1},{:.1}V{:.1}M{x1:.1},{:.1}V{:.1}" stroke="#222" stroke-width="1.2" fill="none"/>"##,
                        cy - 4.0,
                        cy + 4.0,
                        cy - 4.0,
                        cy + 4.0
                    );
                }
                by += BAR_H + 2.0;
            }
            let _ = writeln!(
                rows,
                r#"<text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
                plot_x + plot_w + 10.0,
                y + row_h / 2.0 + 4.0,
                esc(&row.note)
            );
            y += row_h + ROW_GAP;
        }
        // the panel's grid and axis under its bars
        let ticks = (axis_max / step).round() as usize;
        for i in 0..=ticks {
            let v = step * i as f64;
            let x = x_of(v);
            let _ = writeln!(
                body,
                r##"<line x1="{x:.1}" y1="{panel_top:.1}" x2="{x:.1}" y2="{y:.1}" stroke="{}" stroke-width="1"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="#444">{}</text>"##,
                if i == 0 { "#888" } else { "#e6e6e6" },
                y + 12.0,
                fmt_tick(v, step)
            );
        }
        body.push_str(&rows);
        y += 18.0;
    }
    let height = y + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:.0}" height="{height:.0}" viewBox="0 0 {WIDTH:.0} {height:.0}" font-family="sans-serif" role="img" aria-label="{}">"#,
        esc(&chart.title)
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#fff"/><text x="{:.1}" y="22" font-size="15" font-weight="bold" text-anchor="middle">{}</text>"##,
        WIDTH / 2.0,
        esc(&chart.title)
    );
    out.push_str(&body);
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="#444">{}</text>"##,
        plot_x + plot_w / 2.0,
        y + 10.0,
        esc(&chart.unit)
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(tick_step(7.4, 5.0), 2.0);
        assert_eq!(tick_step(0.14, 5.0), 0.05);
        assert_eq!(fmt_tick(0.15, 0.05), "0.15");
        assert_eq!(fmt_tick(4.0, 2.0), "4");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc(r#"<a & "b">"#), "&lt;a &amp; &quot;b&quot;&gt;");
        let svg = bar_chart_svg(&BarChart {
            title: "x < y".into(),
            unit: "ms".into(),
            legend: vec![],
            panels: vec![Panel {
                title: None,
                rows: vec![BarRow {
                    label: "<moe>".into(),
                    bars: vec![Bar {
                        value: f64::NAN,
                        colour: "#000".into(),
                        range: None,
                    }],
                    note: String::new(),
                }],
            }],
        });
        assert!(svg.contains("x &lt; y") && svg.contains("&lt;moe&gt;"));
        assert!(!svg.contains("NaN"));
    }
}
