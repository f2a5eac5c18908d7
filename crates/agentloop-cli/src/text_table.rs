//! Plain-text tables for the terminal: cells cleaned of control characters (a stored
//! string cannot break the output) and cut to a width, columns aligned. Formatting
//! only; the commands decide what goes in them.

/// The widest table cell, in characters (longer text is cut with `…`).
const CELL_MAX: usize = 40;

/// Text with control characters escaped, so a stored string cannot break the output.
pub(crate) fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A table cell: cleaned and cut to [`CELL_MAX`] characters.
pub(crate) fn cell(s: &str) -> String {
    let s = clean(s);
    if s.chars().count() <= CELL_MAX {
        return s;
    }
    let mut cut: String = s.chars().take(CELL_MAX - 1).collect();
    cut.push('…');
    cut
}

/// The rows under the header, each column as wide as its widest cell, two spaces apart.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut put = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(c);
            let pad = widths[i].saturating_sub(c.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    put(&mut header.iter().copied());
    for row in rows {
        put(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_clean_and_bounded() {
        assert_eq!(clean("a\nb\tc"), "a\\nb\\tc");
        let long = "x".repeat(100);
        assert_eq!(cell(&long).chars().count(), CELL_MAX);
        assert!(cell(&long).ends_with('…'));
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
    }
}
