//! The page every run kind's HTML shares: the stylesheet, the header and footer, the checks
//! banner and list, tables (band cells with their swatch), figures and lists.

use std::fmt::Write as _;

use opledger_core::profile::{worst, Check, CheckStatus};

use crate::palette::band_colour;
use crate::svg::esc;

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

pub(super) fn status_class(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Warn => "warn",
        CheckStatus::Fail => "fail",
    }
}

pub(super) fn status_words(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "✓ PASSED",
        CheckStatus::Warn => "! WARNING",
        CheckStatus::Fail => "✗ FAILED",
    }
}

/// The banner and the list of checks.
pub(super) fn checks_section(out: &mut String, title: &str, checks: &[Check]) {
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
pub(super) fn table(out: &mut String, header: &[&str], num: &[bool], rows: &[Vec<String>]) {
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
pub(super) fn text_rows(rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    rows.into_iter()
        .map(|r| r.iter().map(|c| esc(c)).collect())
        .collect()
}

/// A band name with its colour swatch.
pub(super) fn band_cell(band: &str) -> String {
    format!(
        "<span class=\"band\"><span class=\"swatch\" style=\"background:{}\"></span>{}</span>",
        band_colour(band),
        esc(band)
    )
}

/// Text rows whose first cell is a band.
pub(super) fn band_table(out: &mut String, header: &[&str], num: &[bool], rows: Vec<Vec<String>>) {
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

pub(super) fn kv_table(out: &mut String, rows: &[(&str, String)]) {
    out.push_str("<table class=\"kv\">\n");
    for (k, v) in rows {
        let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    out.push_str("</table>\n");
}

pub(super) fn page(title: &str, h1: &str, ledes: &[String], body: &str) -> String {
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

pub(super) fn figure(out: &mut String, id: &str, title: &str, svg: &str, caption: &str) {
    let _ = writeln!(
        out,
        "<section id=\"{id}\"><h2>{}</h2>\n<figure>\n{}<figcaption>{}</figcaption>\n</figure></section>",
        esc(title),
        svg.trim_end(),
        esc(caption)
    );
}

pub(super) fn list(out: &mut String, items: &[String]) {
    out.push_str("<ul>\n");
    for i in items {
        let _ = writeln!(out, "<li>{}</li>", esc(i));
    }
    out.push_str("</ul>\n");
}
