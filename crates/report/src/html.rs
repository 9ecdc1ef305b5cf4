//! The single-file HTML report of any stored run: inline CSS and inline SVG charts, nothing to
//! fetch and no script, so it opens offline. It shows the cross-checks first, as passed, warned
//! or failed in colour and in words, then the charts and tables, then the run's manifest.

use std::fmt::Write as _;

use opledger_core::ab::{Outcome, Verdict};
use opledger_core::census::ExpectationStatus;
use opledger_core::manifest::Manifest;
use opledger_core::profile::{Check, CheckStatus};

use crate::ab::{scenario_label, verdict_name};
use crate::svg::{band_colour, bar_chart_svg, esc, Bar, BarChart, BarRow, Panel};
use crate::view::{AbView, ProfileView, RunView, SweepView, WasteView};

const CSS: &str = r#"
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --head: #f6f8fa;
  --pass: #1a7f37; --pass-bg: #dafbe1; --warn: #9a6700; --warn-bg: #fff8c5;
  --fail: #cf222e; --fail-bg: #ffebe9; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: var(--bg);
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header { padding: 20px 32px 12px; border-bottom: 1px solid var(--line); background: var(--head); }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 6px; }
main { padding: 0 32px 32px; max-width: 1200px; }
.lede { margin: 2px 0; color: var(--muted); }
.headline { font-size: 16px; margin: 14px 0 0; }
table { border-collapse: collapse; margin: 6px 0 12px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 3px 9px; vertical-align: top; }
th { background: var(--head); text-align: left; font-weight: 600; }
td.num, th.num { text-align: right; white-space: nowrap; }
table.kv th { width: 190px; }
table.kv td { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px;
  word-break: break-all; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }
.banner { margin: 16px 0 8px; padding: 10px 14px; border-radius: 6px; font-weight: 600; font-size: 15px;
  border: 1px solid; }
.banner.pass { color: var(--pass); background: var(--pass-bg); border-color: var(--pass); }
.banner.warn { color: var(--warn); background: var(--warn-bg); border-color: var(--warn); }
.banner.fail { color: var(--fail); background: var(--fail-bg); border-color: var(--fail); }
ul.checks { list-style: none; padding: 0; margin: 0; }
ul.checks li { display: flex; gap: 12px; align-items: baseline; padding: 5px 8px; margin: 3px 0;
  border-left: 5px solid; border-radius: 3px; }
ul.checks li.pass { border-color: var(--pass); background: var(--pass-bg); }
ul.checks li.warn { border-color: var(--warn); background: var(--warn-bg); }
ul.checks li.fail { border-color: var(--fail); background: var(--fail-bg); }
.badge { flex: 0 0 96px; font-weight: 700; font-size: 12px; letter-spacing: .04em; }
li.pass .badge { color: var(--pass); } li.warn .badge { color: var(--warn); } li.fail .badge { color: var(--fail); }
.check-name { flex: 0 0 150px; font-weight: 600; }
.ok { color: var(--pass); font-weight: 600; white-space: nowrap; }
.bad { color: var(--fail); font-weight: 600; white-space: nowrap; }
.band { white-space: nowrap; }
figure { margin: 8px 0; }
figure svg { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 12.5px; }
details summary { cursor: pointer; color: var(--muted); }
footer { padding: 12px 32px 24px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); }
"#;

fn status_class(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Warn => "warn",
        CheckStatus::Fail => "fail",
    }
}

fn status_words(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "✓ PASSED",
        CheckStatus::Warn => "! WARNING",
        CheckStatus::Fail => "✗ FAILED",
    }
}

fn worst(checks: &[Check]) -> CheckStatus {
    if checks.iter().any(|c| c.status == CheckStatus::Fail) {
        CheckStatus::Fail
    } else if checks.iter().any(|c| c.status == CheckStatus::Warn) {
        CheckStatus::Warn
    } else {
        CheckStatus::Pass
    }
}

/// The banner and the list of checks.
fn checks_section(out: &mut String, title: &str, checks: &[Check]) {
    let count = |s: CheckStatus| checks.iter().filter(|c| c.status == s).count();
    let (pass, warn, fail) = (
        count(CheckStatus::Pass),
        count(CheckStatus::Warn),
        count(CheckStatus::Fail),
    );
    let w = worst(checks);
    let verdict = match w {
        CheckStatus::Pass => "every check passed".to_string(),
        CheckStatus::Warn => "no check failed; the warnings deserve caution".to_string(),
        CheckStatus::Fail => "a check FAILED: these results must not be trusted".to_string(),
    };
    let _ = writeln!(
        out,
        "<section id=\"checks\"><h2>{}</h2>\n<div class=\"banner {}\">{} passed · {} warned · {} failed: {}</div>\n<ul class=\"checks\">",
        esc(title),
        status_class(w),
        pass,
        warn,
        fail,
        esc(&verdict)
    );
    for c in checks {
        let _ = writeln!(
            out,
            "<li class=\"{}\"><span class=\"badge\">{}</span><span class=\"check-name\">{}</span><span class=\"detail\">{}</span></li>",
            status_class(c.status),
            status_words(c.status),
            esc(&c.name),
            esc(&c.detail)
        );
    }
    out.push_str("</ul></section>\n");
}

/// A table; `num[i]` right-aligns column i. Cells are HTML (escape text with [`esc`]).
fn table(out: &mut String, header: &[&str], num: &[bool], rows: &[Vec<String>]) {
    out.push_str("<table>\n<thead><tr>");
    for (i, h) in header.iter().enumerate() {
        let class = if num.get(i).copied().unwrap_or(false) {
            " class=\"num\""
        } else {
            ""
        };
        let _ = write!(out, "<th{class}>{}</th>", esc(h));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = if num.get(i).copied().unwrap_or(false) {
                " class=\"num\""
            } else {
                ""
            };
            let _ = write!(out, "<td{class}>{cell}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
}

/// Escaped text cells.
fn text_rows(rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    rows.into_iter()
        .map(|r| r.iter().map(|c| esc(c)).collect())
        .collect()
}

/// A band name with its colour swatch.
fn band_cell(band: &str) -> String {
    format!(
        "<span class=\"band\"><span class=\"swatch\" style=\"background:{}\"></span>{}</span>",
        band_colour(band),
        esc(band)
    )
}

/// Text rows whose first cell is a band.
fn band_table(out: &mut String, header: &[&str], num: &[bool], rows: Vec<Vec<String>>) {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == 0 && c != "total" {
                        band_cell(c)
                    } else {
                        esc(c)
                    }
                })
                .collect()
        })
        .collect();
    table(out, header, num, &rows);
}

fn kv_table(out: &mut String, rows: &[(&str, String)]) {
    out.push_str("<table class=\"kv\">\n");
    for (k, v) in rows {
        let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    out.push_str("</table>\n");
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn gib(bytes: u64) -> String {
    format!(
        "{:.2} GiB ({bytes} bytes)",
        bytes as f64 / (1u64 << 30) as f64
    )
}

/// The run's manifest: tool, engine, model, architecture, system, band rules.
fn manifest_section(out: &mut String, m: &Manifest) {
    out.push_str("<section id=\"manifest\"><h2>Run manifest</h2>\n<h3>Run</h3>\n");
    kv_table(
        out,
        &[
            ("tool", m.tool.clone()),
            ("command", m.command.clone()),
            ("command line", m.args.join(" ")),
            ("created (UTC)", m.created_utc.clone()),
            ("manifest schema", m.schema_version.to_string()),
        ],
    );
    out.push_str("<h3>Engine</h3>\n");
    let settings: Vec<String> = m
        .engine
        .settings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    kv_table(
        out,
        &[
            ("engine", m.engine.engine.clone()),
            ("version", m.engine.version.clone()),
            ("backend", m.engine.backend.clone()),
            ("threads", m.engine.threads.to_string()),
            ("settings", settings.join(", ")),
        ],
    );
    out.push_str("<h3>Model</h3>\n");
    kv_table(
        out,
        &[
            ("file", m.model.path.clone()),
            ("size", gib(m.model.size_bytes)),
            ("BLAKE3", m.model.blake3.clone()),
        ],
    );
    let a = &m.model.arch;
    let kinds: Vec<String> = opledger_core::arch::LayerKind::ALL
        .iter()
        .filter_map(|k| {
            let n = a.layers_of(*k);
            (n > 0).then(|| format!("{n} {}", k.as_str().replace('_', " ")))
        })
        .collect();
    out.push_str("<h3>Architecture</h3>\n");
    kv_table(
        out,
        &[
            ("architecture", a.arch.clone()),
            ("layers", format!("{} ({})", a.n_layers(), kinds.join(", "))),
            ("layer kinds", a.layer_summary()),
            (
                "experts",
                if a.n_experts > 0 {
                    format!(
                        "{} routed, {} used a token{}{}",
                        a.n_experts,
                        a.n_experts_used,
                        if a.shared_expert {
                            ", a shared expert"
                        } else {
                            ""
                        },
                        if a.fused_gate_up {
                            ", fused gate/up"
                        } else {
                            ""
                        }
                    )
                } else {
                    "dense FFN".into()
                },
            ),
            ("embedding", a.n_embd.to_string()),
            (
                "heads",
                format!(
                    "{} (KV {}), key {} · value {}",
                    a.n_head, a.n_head_kv, a.key_length, a.value_length
                ),
            ),
            ("FFN width", a.ffn_length.to_string()),
            ("vocabulary", a.n_vocab.to_string()),
        ],
    );
    let s = &m.system;
    out.push_str("<h3>System</h3>\n");
    kv_table(
        out,
        &[
            ("CPU", opt(&s.cpu_model)),
            (
                "CPUs",
                format!(
                    "{} logical, {} physical cores",
                    opt(&s.logical_cpus),
                    opt(&s.physical_cores)
                ),
            ),
            ("CPU flags", s.cpu_flags.join(" ")),
            (
                "memory",
                format!(
                    "{} total, {} available",
                    s.mem_total_bytes
                        .map(gib)
                        .unwrap_or_else(|| "unknown".into()),
                    s.mem_available_bytes
                        .map(gib)
                        .unwrap_or_else(|| "unknown".into())
                ),
            ),
            ("kernel", opt(&s.kernel)),
            ("governor", opt(&s.governor)),
            (
                "load average",
                s.load_avg
                    .map(|l| format!("{} {} {}", l[0], l[1], l[2]))
                    .unwrap_or_else(|| "unknown".into()),
            ),
            ("hostname", opt(&s.hostname)),
        ],
    );
    out.push_str("<h3>Band rules</h3>\n");
    let bands: Vec<Vec<String>> = m
        .band_rules
        .bands
        .iter()
        .map(|b| vec![band_cell(&b.name), esc(&b.description)])
        .collect();
    table(out, &["band", "what it holds"], &[false, false], &bands);
    if !m.model.metadata.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>GGUF metadata ({} keys)</summary>",
            m.model.metadata.len()
        );
        let rows: Vec<(&str, String)> = m
            .model
            .metadata
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                )
            })
            .collect();
        kv_table(out, &rows);
        out.push_str("</details>\n");
    }
    out.push_str("</section>\n");
}

fn page(title: &str, h1: &str, ledes: &[String], body: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<header>\n<h1>{}</h1>",
        esc(title),
        esc(h1)
    );
    for l in ledes {
        let _ = writeln!(out, "<p class=\"lede\">{}</p>", esc(l));
    }
    out.push_str("</header>\n<main>\n");
    out.push_str(body);
    out.push_str("</main>\n<footer>Rendered by <code>opledger report</code> from the run's stored raw data; self-contained: no fonts, scripts or images to fetch.</footer>\n</body>\n</html>\n");
    out
}

fn figure(out: &mut String, id: &str, title: &str, svg: &str, caption: &str) {
    let _ = writeln!(
        out,
        "<section id=\"{id}\"><h2>{}</h2>\n<figure>\n{}<figcaption>{}</figcaption>\n</figure></section>",
        esc(title),
        svg.trim_end(),
        esc(caption)
    );
}

fn list(out: &mut String, items: &[String]) {
    out.push_str("<ul>\n");
    for i in items {
        let _ = writeln!(out, "<li>{}</li>", esc(i));
    }
    out.push_str("</ul>\n");
}

fn profile_chart(v: &ProfileView) -> BarChart {
    let s = &v.summary;
    BarChart {
        title: format!(
            "{} · ms per token by band · {}",
            v.manifest.model_label(),
            crate::bench::test_name(
                v.raw.config.work.chunk_tokens,
                s.depth_tokens,
                s.decode_tokens,
                s.parallel
            )
        ),
        unit: "ms per token (band share of the TIMED time × FUSED wall / tokens); whiskers: range over cycles".into(),
        legend: Vec::new(),
        panels: vec![Panel {
            title: None,
            rows: s
                .bands
                .iter()
                .map(|b| BarRow {
                    label: b.band.clone(),
                    bars: vec![Bar {
                        value: b.ms_per_token,
                        colour: band_colour(&b.band),
                        range: Some((b.ms_per_token_min, b.ms_per_token_max)),
                    }],
                    note: format!("{:.4} ms · {:.1} %", b.ms_per_token, b.share * 100.0),
                })
                .collect(),
        }],
    }
}

fn profile_html(v: &ProfileView) -> String {
    let m = v.manifest;
    let s = &v.summary;
    let (title, work) = crate::profile::heading(m, s);
    let mut body = String::new();
    checks_section(&mut body, "Cross-checks", &s.checks);
    figure(
        &mut body,
        "chart",
        "Where the time goes",
        &bar_chart_svg(&profile_chart(v)),
        &format!(
            "FUSED wall {:.3} ms for {} tokens: {:.1} tok/s",
            s.fused_ms, s.tokens, s.tok_per_s
        ),
    );
    body.push_str("<section id=\"bands\"><h2>Bands</h2>\n");
    band_table(
        &mut body,
        &crate::profile::BAND_HEADER,
        &[false, true, true, true, true, true, true],
        crate::profile::band_rows(s),
    );
    list(&mut body, &crate::profile::figures(s));
    let mut contents = Vec::new();
    if let Some(l) = crate::profile::contents_line("other holds", &s.other) {
        contents.push(l);
    }
    if let Some(l) = crate::profile::contents_line("UNASSIGNED", &s.unassigned) {
        contents.push(l);
    }
    for f in &s.audit {
        contents.push(format!(
            "AUDIT: node {} {} ({}): {}",
            f.node, f.name, f.op, f.why
        ));
    }
    if !contents.is_empty() {
        list(&mut body, &contents);
    }
    body.push_str("</section>\n");
    body.push_str("<section id=\"census\"><h2>Census: the graph against the architecture</h2>\n");
    let c = &v.census;
    let _ = writeln!(
        body,
        "<p>{} nodes · {} views · {} skipped by the backend · {} working · attention path: {}</p>",
        c.total.nodes,
        c.view_nodes,
        c.skipped_nodes,
        c.total.working,
        esc(&c.attention_path)
    );
    let rows: Vec<Vec<String>> = c
        .expectations
        .iter()
        .map(|e| {
            vec![
                esc(&e.op),
                band_cell(&e.band),
                e.expected
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "–".into()),
                e.found.to_string(),
                match e.status() {
                    ExpectationStatus::AsExpected => {
                        "<span class=\"ok\">✓ as expected</span>".into()
                    }
                    ExpectationStatus::Mismatch => "<span class=\"bad\">✗ MISMATCH</span>".into(),
                    ExpectationStatus::NotPredicted => "not predicted".into(),
                },
                esc(&e.rule),
            ]
        })
        .collect();
    table(
        &mut body,
        &["op", "band", "expected", "found", "", "rule"],
        &[false, false, true, true, false, false],
        &rows,
    );
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    page(
        &format!("opledger profile · {}", m.model_label()),
        &format!("Profile of {}", m.model_label()),
        &[title, work],
        &body,
    )
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn sweep_html(v: &SweepView) -> Result<String, String> {
    let m = v.manifest;
    let s = &v.summary;
    let mut body = String::new();
    checks_section(&mut body, "Cross-checks", &s.checks);
    let svg = crate::sweep::sweep_svg(&crate::sweep::sweep_chart_title(m, s), s)?;
    figure(
        &mut body,
        "chart",
        "Bands against context depth",
        &svg,
        &format!(
            "ms/token per band at each depth (points, with the range over cycles), the fitted lines (dashed){}",
            match &s.crossover {
                Some(x) => format!("; crossover: {}", x.text),
                None => String::new(),
            }
        ),
    );
    for (i, (name, p)) in crate::sweep::phases(s).into_iter().enumerate() {
        let decode = p.steps > 0;
        let kinds = crate::sweep::kind_columns(&p);
        let _ = writeln!(
            body,
            "<section id=\"phase{i}\"><h2>{}</h2>",
            esc(&capitalised(&name))
        );
        let mut header: Vec<&str> = vec!["depth", "tok/s", "FUSED ms", "agreement", "coverage"];
        header.extend(p.bands.iter().map(String::as_str));
        header.extend(kinds.iter().map(String::as_str));
        let num = vec![true; header.len()];
        let rows: Vec<Vec<String>> = p
            .depths
            .iter()
            .map(|d| {
                let mut r = vec![
                    d.depth.to_string(),
                    format!("{:.1}", d.tok_per_s),
                    format!("{:.2}", d.fused_ms),
                    crate::sweep::agreement_cell(d, decode),
                    format!("{:.2} %", d.coverage * 100.0),
                ];
                r.extend(d.ms_per_token.iter().map(|x| format!("{x:.4}")));
                r.extend(d.attention_by_kind.iter().map(|x| format!("{x:.4}")));
                r
            })
            .collect();
        let _ = writeln!(
            body,
            "<p>ms/token per band{}, {} tokens a unit, {} cycles: the median of each cycle's paired FUSED and TIMED runs.</p>",
            if decode {
                " per generated token (agreement raw → with the isolation cost removed)"
            } else {
                ""
            },
            p.tokens,
            s.cycles
        );
        table(&mut body, &header, &num, &text_rows(rows));
        body.push_str("<h3>Fits: ms/token = a + b × depth</h3>\n");
        band_table(
            &mut body,
            &["band", "a", "b", "R²", "mean", "CV", "change", ""],
            &[false, true, true, true, true, true, true, false],
            crate::sweep::fit_rows(&p, true),
        );
        let mut items: Vec<String> = p
            .attention_kinds
            .iter()
            .map(|k| format!("attention by layer kind: {}", k.text))
            .collect();
        if let Some(x) = &p.crossover {
            items.push(format!("crossover: {}", x.text));
        }
        items.push(format!(
            "mean |agreement| {:.2} %{} · worst {}",
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
        ));
        list(&mut body, &items);
        body.push_str("</section>\n");
    }
    let mut items = vec![format!("lowest coverage {:.2} %", s.min_coverage * 100.0)];
    if let Some(c) = &s.cost {
        items.push(format!(
            "cost: {:.1} s a cycle (both modes at every depth) against {:.1} s for one plain cumulative prefill: {:.2}x",
            c.cycle_s, c.plain_prefill_s, c.ratio
        ));
    }
    body.push_str("<section id=\"cost\"><h2>Coverage and cost</h2>\n");
    list(&mut body, &items);
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    Ok(page(
        &format!("opledger sweep · {}", m.model_label()),
        &format!("Depth sweep of {}", m.model_label()),
        &[
            format!(
                "{} · {} · {} {} · {} · {} threads",
                m.model_label(),
                m.model.arch.arch,
                m.engine.engine,
                m.engine.version,
                m.engine.backend,
                m.engine.threads
            ),
            format!(
                "chunks of {} tokens at depths 0..{} ({} depths) · {} cycles, medians",
                s.tokens, s.max_depth, s.chunks, s.cycles
            ),
        ],
        &body,
    ))
}

/// The colours of the two sides of an A/B.
const SIDE_A: &str = "#7a8ca3";
const SIDE_B: &str = "#e4572e";

fn ab_chart(v: &AbView) -> BarChart {
    let r = v.report;
    let order = v.manifest.band_rules.band_names();
    BarChart {
        title: format!(
            "Where the difference lives: B ({}) against A ({})",
            r.b, r.a
        ),
        unit: "ms per token by band".into(),
        legend: vec![
            (format!("A: {}", r.a), SIDE_A.into()),
            (format!("B: {}", r.b), SIDE_B.into()),
        ],
        panels: r
            .scenarios
            .iter()
            .map(|s| {
                let mut ledger: Vec<&opledger_core::ab::LedgerRow> = s.ledger.iter().collect();
                ledger.sort_by_key(|l| {
                    order
                        .iter()
                        .position(|o| *o == l.band)
                        .unwrap_or(order.len())
                });
                Panel {
                    title: Some(format!(
                        "{} · B/A {:.3} [{:.3}–{:.3}] {}",
                        scenario_label(&s.work),
                        s.ratio,
                        s.ratio_lo,
                        s.ratio_hi,
                        verdict_name(s.verdict)
                    )),
                    rows: ledger
                        .iter()
                        .map(|l| BarRow {
                            label: l.band.clone(),
                            bars: vec![
                                Bar {
                                    value: l.a_ms_per_token,
                                    colour: SIDE_A.into(),
                                    range: None,
                                },
                                Bar {
                                    value: l.b_ms_per_token,
                                    colour: SIDE_B.into(),
                                    range: None,
                                },
                            ],
                            note: format!(
                                "gap {:+.4} ms{}",
                                l.gap_ms_per_token,
                                if l.ratio.is_finite() {
                                    format!(" · B/A {:.3}", l.ratio)
                                } else {
                                    String::new()
                                }
                            ),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// The checks of an A/B: the correctness gate and the control of every scenario, the noise gate.
fn ab_checks(v: &AbView) -> Vec<Check> {
    let r = v.report;
    let mut out = Vec::new();
    for s in &r.scenarios {
        let c = &s.correctness;
        out.push(Check {
            name: format!("output · {}", scenario_label(&s.work)),
            status: if c.passed {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: format!(
                "{}: top-1 token the same in {}/{} rows, largest relative logit difference {:.1e} (tolerance {:.1e}), lowest cosine {:.5}",
                if c.passed { "same output" } else { "the output CHANGED" },
                c.same_top1,
                c.rows,
                c.max_rel_error,
                r.config.tolerance.max_rel_error,
                c.min_cosine
            ),
        });
    }
    for s in &r.scenarios {
        out.push(Check {
            name: format!("control · {}", scenario_label(&s.work)),
            // anything but "no change" makes the scenario inconclusive (Verdict::of_scenario)
            status: if s.control_verdict == Verdict::NoChange {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: format!(
                "A against itself (its two halves): {:.3} [{:.3}–{:.3}], {} (must show no change, within ±{:.0} %; otherwise the scenario is inconclusive)",
                s.control_ratio,
                s.control_lo,
                s.control_hi,
                verdict_name(s.control_verdict),
                r.config.min_effect * 100.0
            ),
        });
    }
    let rejected: u32 = r.scenarios.iter().map(|s| s.gate.rejected).sum();
    let noisy: u32 = r.scenarios.iter().map(|s| s.gate.kept_noisy).sum();
    out.push(Check {
        name: "noise".into(),
        status: if noisy == 0 {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: format!(
            "{rejected} runs rejected and retaken because other processes used the CPUs (threshold {:.0} % of one CPU for the busiest other process, and of the machine for all others); {noisy} kept although still noisy; in kept runs the busiest other process used up to {:.0} % of one CPU, all others up to {:.1} % of the machine",
            r.config.gate.max_others * 100.0,
            r.scenarios.iter().map(|s| s.gate.max_busiest_kept).fold(0.0, f64::max) * 100.0,
            r.scenarios.iter().map(|s| s.gate.max_others_kept).fold(0.0, f64::max) * 100.0
        ),
    });
    out
}

fn ab_html(v: &AbView) -> String {
    let m = v.manifest;
    let r = v.report;
    let mut body = String::new();
    let verdict_class = match r.verdict {
        Outcome::Refused | Outcome::Inconclusive => "fail",
        Outcome::Slower => "warn",
        Outcome::Faster | Outcome::FasterInSome | Outcome::NoChange => "pass",
    };
    let _ = writeln!(
        body,
        "<p class=\"headline banner {verdict_class}\">verdict: {}</p>",
        esc(r.verdict.words())
    );
    checks_section(&mut body, "Cross-checks", &ab_checks(v));
    figure(
        &mut body,
        "chart",
        "Ledger by band",
        &bar_chart_svg(&ab_chart(v)),
        "ms per token by band for A and B in every scenario, with the gap (B - A)",
    );
    body.push_str("<section id=\"scenarios\"><h2>Scenarios</h2>\n");
    let med = |x: &[f64]| opledger_core::stats::median(x).unwrap_or(f64::NAN);
    let rows: Vec<Vec<String>> = r
        .scenarios
        .iter()
        .map(|s| {
            vec![
                scenario_label(&s.work),
                format!("{:.2}", med(&s.a_ms)),
                format!("{:.2}", med(&s.b_ms)),
                format!("{:.3}", s.ratio),
                format!("[{:.3}–{:.3}]", s.ratio_lo, s.ratio_hi),
                verdict_name(s.verdict).into(),
                format!(
                    "{:.3} [{:.3}–{:.3}] {}",
                    s.control_ratio,
                    s.control_lo,
                    s.control_hi,
                    verdict_name(s.control_verdict)
                ),
                if s.correctness.passed {
                    "same".into()
                } else {
                    "CHANGED".into()
                },
            ]
        })
        .collect();
    table(
        &mut body,
        &[
            "scenario",
            "A ms",
            "B ms",
            "B/A",
            "95 % interval",
            "verdict",
            "control: A vs A (halves)",
            "output",
        ],
        &[false, true, true, true, true, false, false, false],
        &text_rows(rows),
    );
    let _ = writeln!(
        body,
        "<p>{} interleaved pairs a scenario; faster or slower when the whole 95 % interval of B/A lies beyond ±{:.0} %, no change when it lies within; inconclusive when the control (A against itself) does not lie within.</p>",
        r.config.pairs,
        r.config.min_effect * 100.0
    );
    if !r.ablations.is_empty() {
        body.push_str(
            "<h3>Ablations: B with one change turned back, against A, first scenario</h3>\n",
        );
        let rows: Vec<Vec<String>> = r
            .ablations
            .iter()
            .map(|a| {
                vec![
                    a.reverted.clone(),
                    a.knobs.to_string(),
                    format!("{:.3}", a.ratio),
                    format!("[{:.3}–{:.3}]", a.ratio_lo, a.ratio_hi),
                    verdict_name(a.verdict).into(),
                    if a.correct { "same" } else { "CHANGED" }.into(),
                ]
            })
            .collect();
        table(
            &mut body,
            &[
                "without",
                "knobs",
                "B/A",
                "95 % interval",
                "verdict",
                "output",
            ],
            &[false, false, true, true, false, false],
            &text_rows(rows),
        );
    }
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    page(
        &format!("opledger A/B · {}", m.model_label()),
        &format!("A/B on {}", m.model_label()),
        &[
            format!("A (baseline): {} · B (candidate): {}", r.a, r.b),
            format!(
                "{} · {} · {} {} · {}",
                m.model_label(),
                m.model.arch.arch,
                m.engine.engine,
                m.engine.version,
                m.engine.backend
            ),
        ],
        &body,
    )
}

const WASTED: &str = "#c0392b";
const WHOLE: &str = "#9aa5b1";

fn waste_chart(v: &WasteView) -> BarChart {
    BarChart {
        title: format!(
            "{} · time on rows nobody reads, by band",
            v.manifest.model_label()
        ),
        unit: "ms per token".into(),
        legend: vec![
            ("the band's ms/token".into(), WHOLE.into()),
            ("of which on rows nobody reads".into(), WASTED.into()),
        ],
        panels: vec![Panel {
            title: None,
            rows: v
                .summary
                .bands
                .iter()
                .map(|b| BarRow {
                    label: b.band.clone(),
                    bars: vec![
                        Bar {
                            value: b.ms_per_token,
                            colour: WHOLE.into(),
                            range: None,
                        },
                        Bar {
                            value: b.wasted_ms_per_token,
                            colour: WASTED.into(),
                            range: None,
                        },
                    ],
                    note: format!(
                        "{:.4} of {:.4} ms ({:.1} %)",
                        b.wasted_ms_per_token,
                        b.ms_per_token,
                        b.wasted_share_of_band * 100.0
                    ),
                })
                .collect(),
        }],
    }
}

fn waste_html(v: &WasteView) -> String {
    let m = v.manifest;
    let s = &v.summary;
    let (title, work) = crate::waste::heading(m, s);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<p class=\"headline\">{}</p>",
        esc(&crate::waste::headline(s))
    );
    // the timings' own cross-checks, from the same raw data
    let mut checks = match opledger_core::profile::analyse(v.raw, &m.band_rules, &m.model.arch) {
        Ok((_, p)) => p.checks,
        Err(e) => vec![Check {
            name: "timings".into(),
            status: CheckStatus::Fail,
            detail: e.to_string(),
        }],
    };
    checks.push(Check {
        name: "ops without a rule".into(),
        status: if s.unknown_ops.is_empty() {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: if s.unknown_ops.is_empty() {
            "every op of the graph has a row rule".into()
        } else {
            format!(
                "{} op(s) treated as needing every row (waste never claimed for them)",
                s.unknown_ops.len()
            )
        },
    });
    checks.push(Check {
        name: "sinks".into(),
        status: if s.kept.other_sinks.is_empty() {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: if s.kept.other_sinks.is_empty() {
            "every output is the logits or a cache write".into()
        } else {
            format!(
                "{} other sink(s) kept whole to be safe: {}",
                s.kept.other_sinks.len(),
                s.kept.other_sinks.join(", ")
            )
        },
    });
    checks_section(&mut body, "Cross-checks", &checks);
    figure(
        &mut body,
        "chart",
        "Rows nobody reads",
        &bar_chart_svg(&waste_chart(v)),
        "an upper bound on what trimming saves: a matmul cut to fewer rows still streams its whole weight",
    );
    body.push_str("<section id=\"bands\"><h2>By band</h2>\n");
    band_table(
        &mut body,
        &crate::waste::BAND_HEADER,
        &[false, true, true, true, true, true],
        crate::waste::band_rows(s),
    );
    body.push_str("<h3>By layer</h3>\n");
    table(
        &mut body,
        &crate::waste::LAYER_HEADER,
        &[false, true, true, true, true, true],
        &text_rows(crate::waste::layer_rows(s)),
    );
    const TOP: usize = 30;
    let _ = writeln!(
        body,
        "<h3>Nodes with the most waste (top {} of {}; all in nodes.csv)</h3>",
        TOP.min(s.nodes.len()),
        s.nodes.len()
    );
    table(
        &mut body,
        &crate::waste::NODE_HEADER,
        &[true, false, false, true, false, true, true, true],
        &text_rows(crate::waste::node_rows(s, TOP)),
    );
    list(&mut body, &crate::waste::notes(s));
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    page(
        &format!("opledger waste · {}", m.model_label()),
        &format!("Rows nobody reads in {}", m.model_label()),
        &[title, work],
        &body,
    )
}

/// The HTML report of any run.
pub fn html(view: &RunView) -> Result<String, String> {
    Ok(match view {
        RunView::Profile(v) => profile_html(v),
        RunView::Sweep(v) => sweep_html(v)?,
        RunView::Ab(v) => ab_html(v),
        RunView::Waste(v) => waste_html(v),
        other => {
            return Err(format!(
                "{} {} run has no HTML page",
                crate::render::article(other.kind()),
                other.kind()
            ))
        }
    })
}

/// The chart of any run as a standalone SVG file.
pub fn chart_svg(view: &RunView) -> Result<String, String> {
    Ok(match view {
        RunView::Profile(v) => bar_chart_svg(&profile_chart(v)),
        RunView::Sweep(v) => crate::sweep::sweep_svg(
            &crate::sweep::sweep_chart_title(v.manifest, &v.summary),
            &v.summary,
        )?,
        RunView::Ab(v) => bar_chart_svg(&ab_chart(v)),
        RunView::Waste(v) => bar_chart_svg(&waste_chart(v)),
        other => {
            return Err(format!(
                "{} {} run has no chart",
                crate::render::article(other.kind()),
                other.kind()
            ))
        }
    })
}
