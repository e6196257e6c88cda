//! How answers are printed: a human table by default, or the API's own shapes as JSON or
//! YAML (`-o json|yaml`) for scripts.

use std::io::Write;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// The API's JSON, pretty-printed.
    Json,
    /// The same as YAML.
    Yaml,
}

/// Prints `value` as JSON or YAML; `false` for the table format, which the caller
/// prints itself.
pub fn structured<T: Serialize>(format: Format, value: &T) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    match format {
        Format::Table => return Ok(false),
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, value)?;
            writeln!(out)?;
        }
        Format::Yaml => serde_yaml::to_writer(&mut out, value)?,
    }
    Ok(true)
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Self {
        Self {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut text = String::new();
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  "));
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// An instant as the API writes it, to the second.
pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `Some` as text, `None` as `-`.
pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The first line of `text`, at most `max` characters (an error message in a table).
pub fn short(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max && !text.contains('\n') {
        return line.to_string();
    }
    let cut: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// A span of seconds the way people read lateness: `850ms`, `42s`, `3m12s`, `5h4m`.
pub fn seconds(s: f64) -> String {
    if s < 1.0 {
        return format!("{}ms", (s * 1000.0).round() as u64);
    }
    let whole = s.round() as u64;
    match whole {
        0..60 => format!("{whole}s"),
        60..3600 => format!("{}m{}s", whole / 60, whole % 60),
        _ => format!("{}h{}m", whole / 3600, whole % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_its_columns() {
        let mut t = Table::new(&["ID", "STATE", "ERROR"]);
        t.row(vec!["a".into(), "pending".into(), "-".into()]);
        t.row(vec!["bbbb".into(), "dead".into(), "boom".into()]);
        assert_eq!(
            t.render(),
            "ID    STATE    ERROR\na     pending  -\nbbbb  dead     boom\n"
        );
    }

    #[test]
    fn spans_and_long_text_read_well() {
        assert_eq!(seconds(0.25), "250ms");
        assert_eq!(seconds(42.4), "42s");
        assert_eq!(seconds(192.0), "3m12s");
        assert_eq!(seconds(18240.0), "5h4m");
        assert_eq!(short("abcdef", 4), "abc…");
        assert_eq!(short("ab\ncd", 10), "ab…");
        assert_eq!(short("ab", 10), "ab");
        assert_eq!(or_dash(None::<u32>), "-");
    }
}
