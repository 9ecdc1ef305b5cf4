//! The run's manifest section of every page: tool, engine, model, architecture, system, band
//! rules.

use std::fmt::Write as _;

use opledger_core::arch::ArchInfo;
use opledger_core::manifest::Manifest;
use opledger_core::system::SystemSnapshot;

use super::layout::{band_cell, kv_table, table};
use crate::svg::esc;

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
pub(super) fn manifest_section(out: &mut String, m: &Manifest) {
    out.push_str("<section id=\"manifest\"><h2>Run manifest</h2>\n");
    for (title, rows) in [
        ("Run", run_rows(m)),
        ("Engine", engine_rows(m)),
        ("Model", model_rows(m)),
        ("Architecture", arch_rows(m)),
        ("System", system_rows(&m.system)),
    ] {
        let _ = writeln!(out, "<h3>{title}</h3>");
        kv_table(out, &rows);
    }
    out.push_str("<h3>Band rules</h3>\n");
    let bands: Vec<Vec<String>> = m
        .band_rules
        .bands
        .iter()
        .map(|b| vec![band_cell(&b.name), esc(&b.description)])
        .collect();
    table(out, &["band", "what it holds"], &[false, false], &bands);
    metadata_details(out, m);
    out.push_str("</section>\n");
}

/// The tool and the command that made the run.
fn run_rows(m: &Manifest) -> Vec<(&'static str, String)> {
    vec![
        ("tool", m.tool.clone()),
        ("command", m.command.clone()),
        ("command line", m.args.join(" ")),
        ("created (UTC)", m.created_utc.clone()),
        ("manifest schema", m.schema_version.to_string()),
    ]
}

/// The engine, its version, backend, threads and settings.
fn engine_rows(m: &Manifest) -> Vec<(&'static str, String)> {
    let settings: Vec<String> = m
        .engine
        .settings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    vec![
        ("engine", m.engine.engine.clone()),
        ("version", m.engine.version.clone()),
        ("backend", m.engine.backend.clone()),
        (
            "threads",
            if m.engine.threads == 0 && m.command == crate::view::IMPORTED {
                crate::view::NOT_RECORDED.to_string()
            } else {
                m.engine.threads.to_string()
            },
        ),
        ("settings", settings.join(", ")),
    ]
}

/// The model file, or that it was not recorded (an import without `--model`: its path would
/// be the trace's, its size and hash empty).
fn model_rows(m: &Manifest) -> Vec<(&'static str, String)> {
    if !crate::view::model_recorded(m) {
        let nr = crate::view::model_not_recorded(m);
        return vec![("file", nr.clone()), ("size", nr.clone()), ("BLAKE3", nr)];
    }
    vec![
        ("file", m.model.path.clone()),
        ("size", gib(m.model.size_bytes)),
        ("BLAKE3", m.model.blake3.clone()),
    ]
}

/// The architecture facts of the model; with no model recorded, a fact the run does not hold
/// (no layers, a zero width) says so instead of a zero.
fn arch_rows(m: &Manifest) -> Vec<(&'static str, String)> {
    let a = &m.model.arch;
    let mut rows = known_arch_rows(a);
    if !crate::view::model_recorded(m) {
        let nr = crate::view::model_not_recorded(m);
        let zero = [
            a.layers.is_empty(),
            a.layers.is_empty(),
            a.layers.is_empty(),
            a.n_experts == 0,
            a.n_embd == 0,
            a.n_head == 0,
            a.ffn_length == 0,
            a.n_vocab == 0,
        ];
        // rows[0] is the architecture's own name, always stated
        for (row, unknown) in rows.iter_mut().skip(1).zip(&zero[1..]) {
            if *unknown {
                row.1 = nr.clone();
            }
        }
    }
    rows
}

fn known_arch_rows(a: &ArchInfo) -> Vec<(&'static str, String)> {
    let kinds: Vec<String> = opledger_core::arch::LayerKind::ALL
        .iter()
        .filter_map(|k| {
            let n = a.layers_of(*k);
            (n > 0).then(|| format!("{n} {}", k.as_str().replace('_', " ")))
        })
        .collect();
    vec![
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
    ]
}

/// The machine the run was measured on.
fn system_rows(s: &SystemSnapshot) -> Vec<(&'static str, String)> {
    vec![
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
    ]
}

/// The model's GGUF metadata, folded.
fn metadata_details(out: &mut String, m: &Manifest) {
    if m.model.metadata.is_empty() {
        return;
    }
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
