//! Wording shared by the server's messages and vak term: a count with its noun, singular for one.

/// `n` and the noun, singular for one: `1 byte`, `2 bytes`.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {}", noun_for(n, noun))
}

/// The noun alone, singular for one: `line`, `lines`.
pub fn noun_for(n: usize, noun: &str) -> String {
    if n == 1 {
        noun.to_string()
    } else {
        format!("{noun}s")
    }
}
