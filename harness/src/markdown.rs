//! Generated sections of the project's Markdown (docs/drill.md's drill results, BENCHMARKS.md): the
//! text between two marker comments, replaced in place, the markers kept.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// `text` with what lies between `begin` and `end` replaced by `body` (which ends with a
/// newline, or is empty).
pub fn replace_section(text: &str, begin: &str, end: &str, body: &str) -> Result<String> {
    let (Some(start), Some(stop)) = (text.find(begin), text.find(end)) else {
        bail!("lacks the {begin} … {end} markers");
    };
    Ok(format!("{}{begin}\n{body}{end}{}", &text[..start], &text[stop + end.len()..]))
}

/// [`replace_section`] on a file; `empty` is the text when the file does not exist yet.
pub fn update_section(path: &Path, empty: Option<&str>, begin: &str, end: &str, body: &str) -> Result<()> {
    let text = match (std::fs::read_to_string(path), empty) {
        (Ok(text), _) => text,
        (Err(_), Some(empty)) => empty.to_string(),
        (Err(e), None) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let text = replace_section(&text, begin, end, body).with_context(|| path.display().to_string())?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_between_the_markers_only() {
        let text = "# T\n\n<!-- b -->\nold\n<!-- e -->\ntail\n";
        assert_eq!(
            replace_section(text, "<!-- b -->", "<!-- e -->", "new\n").unwrap(),
            "# T\n\n<!-- b -->\nnew\n<!-- e -->\ntail\n"
        );
        assert!(replace_section("no markers", "<!-- b -->", "<!-- e -->", "").is_err());
    }
}
