//! Renderers of a depth sweep: the per-depth table, the fits and crossover, the CSV and an SVG
//! chart of ms/token per band against depth with the fitted lines and the crossover marked.

use std::fmt::Write as _;

use opledger_core::manifest::Manifest;
use opledger_core::profile::CheckStatus;
use opledger_core::sweep::{DepthRow, PhaseSummary, SweepSummary};
use plotters::prelude::*;

use crate::table::{text_table, Align};

fn mark(status: CheckStatus) -> &'static str {
    match status {
        CheckStatus::Pass => "ok",
        CheckStatus::Warn => "WARN",
        CheckStatus::Fail => "FAIL",
    }
}

/// The phases of a sweep: the prefill chunks, and the decode steps after them where measured,
/// with their names.
pub(crate) fn phases(s: &SweepSummary) -> Vec<(String, PhaseSummary)> {
    let prefill = if s.prefill_raw_split {
        format!(
            "prefill (pp{}; raw shares: RPC round trips included, not removed)",
            s.tokens
        )
    } else {
        format!("prefill (pp{})", s.tokens)
    };
    let mut out = vec![(prefill, s.prefill())];
    if let Some(d) = &s.decode {
        let shape = if d.parallel > 1 {
            format!("tg{} x{}", d.steps, d.parallel)
        } else {
            format!("tg{}", d.steps)
        };
        out.push((format!("decode ({shape}) after every chunk"), d.clone()));
    }
    out
}

/// A phase in the CSVs: `decode`, `prefill`, or `prefill (raw)` for a split sweep's prefill rows
/// (RPC round trips in the shares, see [`opledger_core::sweep::SPLIT_RAW_NOTE`]).
pub(crate) fn phase_name(p: &PhaseSummary) -> &'static str {
    if p.steps > 0 {
        "decode"
    } else if p.raw_split {
        "prefill (raw)"
    } else {
        "prefill"
    }
}

/// Column names of the attention band split by layer kind: `attention:sliding_window`.
pub(crate) fn kind_columns(p: &PhaseSummary) -> Vec<String> {
    p.attention_kinds
        .iter()
        .map(|k| format!("attention:{}", k.kind.as_str()))
        .collect()
}

pub(crate) fn agreement_cell(d: &DepthRow, decode: bool) -> String {
    if decode {
        format!(
            "{:+.1} % -> {:+.1} %",
            d.agreement * 100.0,
            d.agreement_corrected * 100.0
        )
    } else {
        format!("{:+.1} %", d.agreement * 100.0)
    }
}

pub(crate) fn fit_rows(p: &PhaseSummary, cv: bool) -> Vec<Vec<String>> {
    p.fits
        .iter()
        .map(|f| {
            let mut r = vec![
                f.band.clone(),
                format!("{:.4}", f.fit.a),
                format!("{:.3e}", f.fit.b),
                format!("{:.4}", f.fit.r2),
                format!("{:.4}", f.mean_ms_per_token),
            ];
            if cv {
                r.push(format!("{:.1} %", f.cv * 100.0));
            }
            r.push(format!("{:.1} %", f.change * 100.0));
            r.push(if f.flat { "flat" } else { "grows" }.to_string());
            r
        })
        .collect()
}

/// The terminal rendering.
pub fn sweep_text(m: &Manifest, s: &SweepSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} · {} · {} {} · {} · {} threads\nchunks of {} tokens at depths 0..{} ({} depths) · {} cycles, medians\n{}\n",
        m.model_label(),
        m.model.arch.arch,
        m.engine.engine,
        m.engine.version,
        m.engine.backend,
        m.engine.threads,
        s.tokens,
        s.max_depth,
        s.chunks,
        s.cycles,
        s.depth_axis
    );
    for (name, p) in phases(s) {
        let decode = p.steps > 0;
        let kinds = kind_columns(&p);
        let mut header: Vec<&str> = vec!["depth", "tok/s", "FUSED ms", "agreement"];
        header.extend(p.bands.iter().map(|b| b.as_str()));
        header.extend(kinds.iter().map(String::as_str));
        let align = vec![Align::Right; header.len()];
        let rows: Vec<Vec<String>> = p
            .depths
            .iter()
            .map(|d| {
                let mut r = vec![
                    d.depth.to_string(),
                    format!("{:.1}", d.tok_per_s),
                    format!("{:.1}", d.fused_ms),
                    agreement_cell(d, decode),
                ];
                r.extend(d.ms_per_token.iter().map(|v| format!("{v:.4}")));
                r.extend(d.attention_by_kind.iter().map(|v| format!("{v:.4}")));
                r
            })
            .collect();
        let _ = writeln!(
            out,
            "{name}, ms/token per band{}:\n{}\n",
            if decode {
                " (per generated token; agreement raw -> isolation cost removed)"
            } else {
                ""
            },
            text_table(&header, &align, &rows)
        );
        let _ = writeln!(
            out,
            "fits, ms/token = a + b x depth:\n{}\n",
            text_table(
                &["band", "a", "b", "R²", "mean", "CV", "change", ""],
                &[
                    Align::Left,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Left
                ],
                &fit_rows(&p, true)
            )
        );
        if !p.attention_kinds.is_empty() {
            let _ = writeln!(out, "attention by layer kind:");
            for k in &p.attention_kinds {
                let _ = writeln!(out, "  {}", k.text);
            }
        }
        if let Some(x) = &p.crossover {
            let _ = writeln!(out, "crossover: {}", x.text);
        }
        let _ = writeln!(
            out,
            "mean |agreement| {:.2} %{} · worst {}\n",
            p.mean_abs_agreement * 100.0,
            if decode {
                format!(
                    " ({:.2} % after removing the isolation cost)",
                    p.mean_abs_agreement_corrected * 100.0
                )
            } else {
                String::new()
            },
            p.worst_agreement
                .map(|(d, a)| format!("{:+.1} % at depth {d}", a * 100.0))
                .unwrap_or_else(|| "-".into())
        );
    }
    let _ = writeln!(out, "lowest coverage {:.2} %", s.min_coverage * 100.0);
    if let Some(c) = &s.cost {
        let _ = writeln!(
            out,
            "cost: {:.1} s a cycle (both modes at every depth) against {:.1} s for one plain cumulative prefill: {:.2}x",
            c.cycle_s, c.plain_prefill_s, c.ratio
        );
    }
    let checks: Vec<String> = s
        .checks
        .iter()
        .map(|c| format!("{} {}", mark(c.status), c.name))
        .collect();
    let _ = writeln!(out, "checks: {}", checks.join(" · "));
    for c in s.checks.iter().filter(|c| c.status != CheckStatus::Pass) {
        let _ = writeln!(out, "  {} {}: {}", mark(c.status), c.name, c.detail);
    }
    out
}

/// One row per depth and phase (`phase` is `prefill` or `decode`; a decode row's depth is the
/// context its first step starts from, its bands per generated token with the isolation cost
/// removed).
pub fn sweep_csv(s: &SweepSummary) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let phases = phases(s);
    // one column per band and kind any phase has, in first-seen order
    let mut bands: Vec<String> = Vec::new();
    let mut kinds: Vec<String> = Vec::new();
    for (_, p) in &phases {
        for b in &p.bands {
            if !bands.contains(b) {
                bands.push(b.clone());
            }
        }
        for k in kind_columns(p) {
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
    }
    let mut header = vec![
        "phase".to_string(),
        "depth".into(),
        "tokens".into(),
        "tok_per_s".into(),
        "fused_ms".into(),
        "fused_ms_min".into(),
        "fused_ms_max".into(),
        "timed_sum_ms".into(),
        "agreement".into(),
        "agreement_corrected".into(),
        "coverage".into(),
    ];
    header.extend(bands.iter().map(|b| format!("{b}_ms_per_token")));
    header.extend(kinds.iter().map(|k| format!("{k}_ms_per_token")));
    w.write_record(&header)?;
    for (_, p) in &phases {
        let pk = kind_columns(p);
        for d in &p.depths {
            let mut r = vec![
                phase_name(p).to_string(),
                d.depth.to_string(),
                p.tokens.to_string(),
                format!("{:.4}", d.tok_per_s),
                format!("{:.4}", d.fused_ms),
                format!("{:.4}", d.fused_ms_min),
                format!("{:.4}", d.fused_ms_max),
                format!("{:.4}", d.timed_sum_ms),
                format!("{:.6}", d.agreement),
                format!("{:.6}", d.agreement_corrected),
                format!("{:.6}", d.coverage),
            ];
            r.extend(bands.iter().map(|b| {
                p.bands
                    .iter()
                    .position(|x| x == b)
                    .map(|i| format!("{:.6}", d.ms_per_token[i]))
                    .unwrap_or_default()
            }));
            r.extend(kinds.iter().map(|k| {
                pk.iter()
                    .position(|x| x == k)
                    .map(|i| format!("{:.6}", d.attention_by_kind[i]))
                    .unwrap_or_default()
            }));
            w.write_record(&r)?;
        }
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

pub use crate::palette::band_rgb;

/// An SVG chart: ms/token per band (points and lines) against depth, the fitted lines dashed,
/// the attention band by layer kind dotted, the crossover marked; a second panel for the decode
/// steps where the sweep measured them.
pub fn sweep_svg(title: &str, s: &SweepSummary) -> Result<String, String> {
    let phases = phases(s);
    let height = 540 * phases.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let panels = root.split_evenly((phases.len(), 1));
        for ((name, p), area) in phases.iter().zip(&panels) {
            let caption = if phases.len() > 1 {
                format!("{title} · {name}")
            } else {
                title.to_string()
            };
            phase_chart(area, &caption, s.max_depth, p)?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn phase_chart(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    max_depth: u32,
    p: &PhaseSummary,
) -> Result<(), String> {
    let x_max = (max_depth.max(1) + if p.steps > 0 { p.tokens } else { 0 }) as f64;
    let x_max = x_max.max(p.depths.iter().map(|d| d.depth as f64).fold(1.0, f64::max));
    let y_max = p
        .depths
        .iter()
        .flat_map(|d| d.ms_per_token.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(if p.steps > 0 {
            "context depth at the first decode step (tokens)"
        } else {
            "context depth at the chunk's start (tokens)"
        })
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(if p.steps > 0 {
            "ms per generated token"
        } else if p.raw_split {
            "ms per token (raw: RPC round trips included)"
        } else {
            "ms per token"
        })
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(|e| e.to_string())?;
    for (b, band) in p.bands.iter().enumerate() {
        let colour = band_rgb(band);
        let points: Vec<(f64, f64)> = p
            .depths
            .iter()
            .map(|d| (d.depth as f64, d.ms_per_token[b]))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(band.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| e.to_string())?;
        if let Some(f) = p.fits.iter().find(|f| &f.band == band) {
            let line: Vec<(f64, f64)> = (0..=20)
                .map(|i| {
                    let x = x_max * i as f64 / 20.0;
                    (x, (f.fit.a + f.fit.b * x).max(0.0))
                })
                .collect();
            chart
                .draw_series(DashedLineSeries::new(
                    line,
                    6,
                    4,
                    colour.mix(0.6).stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    // the attention band by layer kind: dotted, in the attention colour, lighter for the
    // sliding-window layers
    for (k, series) in p.attention_kinds.iter().enumerate() {
        let base = band_rgb("attention");
        let colour = if series.kind == opledger_core::arch::LayerKind::SlidingWindow {
            base.mix(0.45)
        } else {
            base.mix(0.8)
        };
        let points: Vec<(f64, f64)> = p
            .depths
            .iter()
            .map(|d| (d.depth as f64, d.attention_by_kind[k]))
            .collect();
        let label = match series.window {
            Some(w) => format!("attention, {} (window {w})", series.kind.as_str()),
            None => format!("attention, {}", series.kind.as_str()),
        };
        chart
            .draw_series(DashedLineSeries::new(points, 2, 3, colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
    }
    if let Some(x) = p.crossover.as_ref().filter(|x| x.status == "within") {
        if let Some(at) = x.depth {
            let red = RGBColor(0xc0, 0x00, 0x00);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(at, 0.0), (at, y_max)],
                    4,
                    4,
                    red.stroke_width(1),
                ))
                .map_err(|e| e.to_string())?
                .label(format!("crossover {at:.0}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], red));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The markdown rendering (after the per-depth table of [`crate::bench`]): fits, crossover and
/// checks.
pub fn sweep_markdown(m: &Manifest, s: &SweepSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## {} · {} · {} {} · {} · {} threads\n\nchunks of {} tokens at depths 0..{} ({} depths) · {} cycles, medians\n",
        m.model_label(),
        m.model.arch.arch,
        m.engine.engine,
        m.engine.version,
        m.engine.backend,
        m.engine.threads,
        s.tokens,
        s.max_depth,
        s.chunks,
        s.cycles
    );
    for (name, p) in phases(s) {
        let _ = writeln!(
            out,
            "{name}, fits, ms/token = a + b x depth:\n\n{}\n",
            crate::table::markdown_table(
                &["band", "a", "b", "R²", "mean", "change", ""],
                &[
                    Align::Left,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Left
                ],
                &fit_rows(&p, false)
            )
        );
        for k in &p.attention_kinds {
            let _ = writeln!(out, "- {}", k.text);
        }
        if let Some(x) = &p.crossover {
            let _ = writeln!(out, "- crossover: {}", x.text);
        }
        let _ = writeln!(
            out,
            "- mean |agreement| {:.2} %{}\n",
            p.mean_abs_agreement * 100.0,
            if p.steps > 0 {
                format!(
                    " ({:.2} % after removing the isolation cost)",
                    p.mean_abs_agreement_corrected * 100.0
                )
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(out, "- lowest coverage {:.2} %", s.min_coverage * 100.0);
    let _ = writeln!(out, "- {}", s.depth_axis);
    let _ = writeln!(out, "\n| check | status | detail |\n| --- | --- | --- |");
    for c in &s.checks {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            c.name,
            mark(c.status),
            crate::table::markdown_cell(&c.detail)
        );
    }
    out
}

/// The title of a sweep's chart.
pub fn sweep_chart_title(m: &Manifest, s: &SweepSummary) -> String {
    format!(
        "{} · {} · {} threads · chunk {}",
        m.model_label(),
        m.engine.engine,
        m.engine.threads,
        s.tokens
    )
}
