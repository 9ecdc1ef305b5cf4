//! Table layout shared by the renderers (comfy-table, no terminal-width dependence so output is
//! the same everywhere).

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};

/// Column alignment.
#[derive(Clone, Copy)]
pub enum Align {
    Left,
    Right,
}

/// A plain table (no borders) for terminals.
pub fn text_table(header: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    build(presets::NOTHING, header, align, rows)
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A GitHub-flavoured markdown table.
pub fn markdown_table(header: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    build(presets::ASCII_MARKDOWN, header, align, rows)
}

/// A terminal section: a blank line, its title, the table, a blank line, then one line per note.
pub fn text_section(
    title: &str,
    header: &[&str],
    align: &[Align],
    rows: &[Vec<String>],
    notes: &[String],
) -> String {
    let mut out = format!("\n{title}\n{}\n\n", text_table(header, align, rows));
    for l in notes {
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// A markdown section: `### heading`, its title, the table, then one bullet per note.
pub fn markdown_section(
    heading: &str,
    title: &str,
    header: &[&str],
    align: &[Align],
    rows: &[Vec<String>],
    notes: &[String],
) -> String {
    let mut out = format!(
        "\n### {heading}\n\n{title}\n\n{}\n\n",
        markdown_table(header, align, rows)
    );
    for l in notes {
        out.push_str("- ");
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// Text for a cell of a hand-written markdown table: a `|` would end the cell.
pub fn markdown_cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn build(preset: &str, header: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let mut t = Table::new();
    t.load_preset(preset)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.to_string()));
    for row in rows {
        t.add_row(row.clone());
    }
    for (i, a) in align.iter().enumerate() {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(match a {
                Align::Left => CellAlignment::Left,
                Align::Right => CellAlignment::Right,
            });
        }
    }
    t.to_string()
}
