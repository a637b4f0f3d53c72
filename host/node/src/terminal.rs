//! Text that others wrote, as an operator's terminal is shown it: what nodes report, what hooks and registries
//! answer, what pods' annotations say. Any of them could hold escape sequences that a terminal would obey
//! (rewrite the screen, set the window title, answer back), so every such string is printed with its control
//! characters made visible.

use std::borrow::Cow;

/// Whether a terminal may act on `c` instead of showing it: C0 controls (tab and newline included: a line of
/// the output must not pose as another), DEL, C1 controls (CSI and OSC among them), and the bidirectional
/// formatting characters, which reorder what a line shows.
fn acts(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character a terminal may act on written as its Rust escape (`\u{1b}`, `\n`); the text
/// itself when it has none. An escape sequence so becomes plain text after its `\u{1b}`.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match acts(c) {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `value` as pretty JSON for a terminal. serde_json escapes C0 controls in strings but writes DEL, C1 and the
/// bidirectional characters as they are; here they are `\uXXXX` escapes too, so the document means the same
/// and shows nothing a terminal acts on. (Outside strings serde_json writes only ASCII punctuation, digits,
/// letters and whitespace, so every such character is inside a string.)
pub fn json(value: &impl serde::Serialize) -> serde_json::Result<String> {
    let text = serde_json::to_string_pretty(value)?;
    if !text.chars().any(acts) {
        return Ok(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match acts(c) && c != '\n' {
            true => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            false => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_escape_sequences_are_shown_not_obeyed() {
        assert!(matches!(
            printable("sha256:ab PullFailed é ü"),
            Cow::Borrowed(_)
        ));
        let hostile = "ok\u{1b}[2J\u{1b}]0;owned\u{7}\r\nfake line\t\u{7f}\u{9b}31m\u{202e}txt";
        let shown = printable(hostile);
        assert_eq!(
            shown,
            "ok\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\r\\nfake line\\t\\u{7f}\\u{9b}31m\\u{202e}txt"
        );
        assert!(!shown.chars().any(acts), "{shown}");
    }

    #[test]
    fn json_for_a_terminal_means_the_same_and_shows_no_control_character() {
        let value = serde_json::json!({"message": "a\u{1b}[31mb\u{7f}c\u{9b}d\u{2066}e\n", "n": 1});
        let text = json(&value).unwrap();
        assert!(!text.chars().any(|c| acts(c) && c != '\n'), "{text}");
        assert!(
            text.contains(r"a\u001b[31mb\u007fc\u009bd\u2066e\n"),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }
}
