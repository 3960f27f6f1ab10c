//! The interactive terminal: raw mode entered once and left on every exit path (return, error, panic), and a live region at the bottom (the unfinished streamed line, the status and activity lines, the prompt) redrawn below output that scrolls away above it.
//!
//! Finished output is printed once and never touched again, so the
//! terminal's own scrollback holds the conversation. Only the live region is
//! redrawn, and it is kept small: a streamed line is committed row by row as
//! soon as it is wider than the terminal.

use super::render::{Piece, Style};
use crossterm::cursor::{MoveTo, MoveToColumn, MoveUp, Show};
use crossterm::event::{DisableBracketedPaste, EnableBracketedPaste};
use crossterm::style::{Attribute, Color, Print, ResetColor, SetAttribute, SetForegroundColor};
use crossterm::terminal::{self, Clear, ClearType};
use crossterm::{execute, queue};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

static RAW: AtomicBool = AtomicBool::new(false);
static HOOK: std::sync::Once = std::sync::Once::new();

/// Raw mode for as long as it lives. Dropping it, or a panic anywhere (the
/// hook runs before the default one prints the message), gives the terminal
/// back as it was.
pub(crate) struct TerminalGuard(());

impl TerminalGuard {
    pub(crate) fn enter() -> std::io::Result<TerminalGuard> {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        terminal::enable_raw_mode()?;
        RAW.store(true, Ordering::SeqCst);
        execute!(std::io::stdout(), EnableBracketedPaste)?;
        Ok(TerminalGuard(()))
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode (once; later calls do nothing).
pub(crate) fn restore() {
    if RAW.swap(false, Ordering::SeqCst) {
        let _ = execute!(
            std::io::stdout(),
            DisableBracketedPaste,
            SetAttribute(Attribute::Reset),
            ResetColor,
            Show
        );
        let _ = terminal::disable_raw_mode();
    }
}

/// What the bottom line shows: a prefix (the prompt, or an approval question) and the input being edited.
pub(crate) struct PromptLine {
    pub prefix: String,
    pub style: Style,
    pub input: String,
    /// The cursor, in characters into `input`.
    pub cursor: usize,
}

pub(crate) struct Screen {
    out: std::io::Stdout,
    cols: usize,
    /// The streamed line not finished yet, and whether it is thinking.
    partial: String,
    partial_thinking: bool,
    /// A state shown above the prompt (`reconnecting…`), empty when none.
    status: String,
    /// What is going on (`⠋ running…` while a run is live), shown under the status; empty when idle.
    activity: String,
    /// The cursor's row within the live region, counted from its top.
    cursor_row: usize,
}

pub(crate) fn width(s: &str) -> usize {
    UnicodeWidthStr::width(s)
}

/// Where to end the first row of `s` when it is wider than `cols`: at the
/// last space that leaves the row within `cols` (the space itself is dropped),
/// else (one word wider than the row) mid-word at the edge. Returns the byte
/// index the row ends at and the one the rest starts at.
pub(crate) fn break_row(s: &str, cols: usize) -> (usize, usize) {
    let cut = fit(s, cols);
    if cut == 0 {
        // Not even one character fits (a wide one in a 1-column space): take it anyway.
        let n = s.chars().next().map_or(0, char::len_utf8);
        return (n, n);
    }
    if s[cut..].starts_with(' ') {
        return (cut, cut + 1);
    }
    match s[..cut].rfind(' ') {
        Some(sp) if !s[..sp].trim().is_empty() => (sp, sp + 1),
        _ => (cut, cut),
    }
}

/// `s` as rows of at most `cols` columns, broken at spaces where there are any.
pub(crate) fn wrap(s: &str, cols: usize) -> Vec<String> {
    let mut rows = Vec::new();
    let mut rest = s;
    while width(rest) > cols {
        let (end, next) = break_row(rest, cols);
        rows.push(rest[..end].trim_end().to_string());
        rest = &rest[next..];
    }
    rows.push(rest.to_string());
    rows
}

/// The longest prefix of `s` that fits in `cols` columns, as a byte index.
fn fit(s: &str, cols: usize) -> usize {
    let mut w = 0;
    for (i, c) in s.char_indices() {
        w += c.width().unwrap_or(0);
        if w > cols {
            return i;
        }
    }
    s.len()
}

fn style_on(out: &mut impl Write, style: Style) -> std::io::Result<()> {
    match style {
        Style::Plain => Ok(()),
        Style::Dim | Style::Info => queue!(out, SetAttribute(Attribute::Dim)),
        Style::User => queue!(out, SetAttribute(Attribute::Bold)),
        Style::Good => queue!(out, SetForegroundColor(Color::Green)),
        Style::Bad => queue!(out, SetForegroundColor(Color::Red)),
        Style::Note => queue!(out, SetForegroundColor(Color::Yellow)),
    }
}

fn style_off(out: &mut impl Write) -> std::io::Result<()> {
    queue!(out, SetAttribute(Attribute::Reset), ResetColor)
}

impl Default for Screen {
    fn default() -> Self {
        Self::new()
    }
}

impl Screen {
    pub(crate) fn new() -> Screen {
        let mut s = Screen {
            out: std::io::stdout(),
            cols: 80,
            partial: String::new(),
            partial_thinking: false,
            status: String::new(),
            activity: String::new(),
            cursor_row: 0,
        };
        s.resize();
        s
    }

    pub(crate) fn resize(&mut self) {
        let env = |name: &str| std::env::var(name).ok();
        let (cols, _rows) = size_or_fallback(terminal::size().ok(), env("COLUMNS"), env("LINES"));
        self.cols = cols.max(10);
    }

    pub(crate) fn set_status(&mut self, status: impl Into<String>) {
        self.status = status.into();
    }

    pub(crate) fn set_activity(&mut self, activity: impl Into<String>) {
        self.activity = activity.into();
    }

    /// Erases the live region, prints `pieces` above it, and draws it again.
    pub(crate) fn show(&mut self, pieces: Vec<Piece>, prompt: &PromptLine) -> std::io::Result<()> {
        self.erase()?;
        for p in pieces {
            self.piece(p)?;
        }
        self.draw(prompt)
    }

    /// Clears the whole screen and scrollback (a resync redraws from the transcript).
    pub(crate) fn clear_all(&mut self) -> std::io::Result<()> {
        self.partial.clear();
        self.cursor_row = 0;
        queue!(
            self.out,
            Clear(ClearType::All),
            Clear(ClearType::Purge),
            MoveTo(0, 0)
        )
    }

    /// Leaves the screen for the shell: the live region erased, an unfinished line ended.
    pub(crate) fn close(&mut self) -> std::io::Result<()> {
        self.erase()?;
        self.end_partial()?;
        self.out.flush()
    }

    fn erase(&mut self) -> std::io::Result<()> {
        queue!(self.out, MoveToColumn(0))?;
        if self.cursor_row > 0 {
            queue!(self.out, MoveUp(self.cursor_row as u16))?;
        }
        self.cursor_row = 0;
        queue!(self.out, Clear(ClearType::FromCursorDown))
    }

    fn permanent(&mut self, style: Style, text: &str) -> std::io::Result<()> {
        style_on(&mut self.out, style)?;
        queue!(self.out, Print(text))?;
        style_off(&mut self.out)?;
        queue!(self.out, Print("\r\n"))
    }

    fn stream_style(thinking: bool) -> Style {
        if thinking {
            Style::Dim
        } else {
            Style::Plain
        }
    }

    fn end_partial(&mut self) -> std::io::Result<()> {
        if !self.partial.is_empty() {
            let text = std::mem::take(&mut self.partial);
            self.permanent(Self::stream_style(self.partial_thinking), &text)?;
        }
        Ok(())
    }

    fn piece(&mut self, p: Piece) -> std::io::Result<()> {
        match p {
            Piece::Stream { thinking, text } => {
                if thinking != self.partial_thinking {
                    self.end_partial()?;
                    self.partial_thinking = thinking;
                }
                let style = Self::stream_style(thinking);
                for (i, chunk) in text.split('\n').enumerate() {
                    if i > 0 {
                        let line = std::mem::take(&mut self.partial);
                        self.permanent(style, &line)?;
                    }
                    self.partial.push_str(chunk);
                    // Rows that are full will not change: commit them, broken
                    // between words (a word is only cut when it is wider than a row).
                    while width(&self.partial) > self.cols {
                        let (end, next) = break_row(&self.partial, self.cols);
                        let row = self.partial[..end].trim_end().to_string();
                        self.partial.drain(..next);
                        self.permanent(style, &row)?;
                    }
                }
                Ok(())
            }
            Piece::Line { style, text } => {
                self.end_partial()?;
                // Entries are one line: cut to the terminal's width.
                let cut = matches!(style, Style::Dim | Style::Good | Style::Bad);
                if cut && width(&text) > self.cols {
                    let text = format!("{}…", &text[..fit(&text, self.cols - 1)]);
                    return self.permanent(style, &text);
                }
                // The others wrap, between words.
                for row in wrap(&text, self.cols) {
                    self.permanent(style, &row)?;
                }
                Ok(())
            }
        }
    }

    fn draw(&mut self, prompt: &PromptLine) -> std::io::Result<()> {
        let cols = self.cols;
        let rows_of = |w: usize| w.div_ceil(cols).max(1);
        let mut rows = 0;
        // The unfinished output line first, right under the output it continues;
        // then what is going on (a reconnect, a run), then the prompt.
        if !self.partial.is_empty() {
            style_on(&mut self.out, Self::stream_style(self.partial_thinking))?;
            queue!(self.out, Print(&self.partial))?;
            style_off(&mut self.out)?;
            queue!(self.out, Print("\r\n"))?;
            rows += rows_of(width(&self.partial));
        }
        for (text, style) in [(&self.status, Style::Note), (&self.activity, Style::Dim)] {
            if text.is_empty() {
                continue;
            }
            let s = &text[..fit(text, cols)];
            style_on(&mut self.out, style)?;
            queue!(self.out, Print(s))?;
            style_off(&mut self.out)?;
            queue!(self.out, Print("\r\n"))?;
            rows += 1;
        }
        // Pasted newlines show as ⏎ so the input stays one logical line.
        let shown: String = prompt
            .input
            .chars()
            .map(|c| if c == '\n' { '⏎' } else { c })
            .collect();
        style_on(&mut self.out, prompt.style)?;
        queue!(self.out, Print(&prompt.prefix))?;
        style_off(&mut self.out)?;
        queue!(self.out, Print(&shown))?;
        let total = width(&prompt.prefix) + width(&shown);
        let before: String = shown.chars().take(prompt.cursor).collect();
        let at = width(&prompt.prefix) + width(&before);
        let mut end_row = rows + total.saturating_sub(1) / cols;
        let (row, col) = (rows + at / cols, at % cols);
        if row > end_row {
            // The cursor sits just past a full last row: open the row it belongs on.
            queue!(self.out, Print("\r\n"))?;
            end_row = row;
        }
        if end_row > row {
            queue!(self.out, MoveUp((end_row - row) as u16))?;
        }
        queue!(self.out, MoveToColumn(col as u16))?;
        self.cursor_row = row;
        self.out.flush()
    }
}

/// The terminal's size (columns, rows) as reported, where a 0 (some pty,
/// CI and ssh setups report 0x0) or a failed query means unknown: then
/// `$COLUMNS` / `$LINES` when they hold a positive number, else 80x24.
fn size_or_fallback(
    reported: Option<(u16, u16)>,
    columns: Option<String>,
    lines: Option<String>,
) -> (usize, usize) {
    let known = |n: Option<u16>, var: Option<String>, default: usize| {
        n.filter(|&n| n > 0)
            .map(usize::from)
            .or_else(|| {
                var.and_then(|v| v.trim().parse::<usize>().ok())
                    .filter(|&n| n > 0)
            })
            .unwrap_or(default)
    };
    (
        known(reported.map(|(c, _)| c), columns, 80),
        known(reported.map(|(_, r)| r), lines, 24),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_size_is_unknown_and_falls_back_to_the_environment_or_80x24() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(size_or_fallback(Some((120, 40)), s("90"), s("30")), (120, 40));
        // Reported as 0x0: the environment's, else 80x24 (never a 10-column wrap).
        assert_eq!(size_or_fallback(Some((0, 0)), s("132"), s("50")), (132, 50));
        assert_eq!(size_or_fallback(Some((0, 0)), None, None), (80, 24));
        assert_eq!(size_or_fallback(Some((0, 33)), s("0"), s("x")), (80, 33));
        assert_eq!(size_or_fallback(None, s(" 100 "), None), (100, 24));
    }

    #[test]
    fn fit_counts_columns_not_bytes() {
        assert_eq!(fit("abcdef", 4), 4);
        assert_eq!(fit("ab", 4), 2);
        // Each of these is two columns wide: only two fit in five.
        assert_eq!(fit("日本語", 5), "日本".len());
    }

    #[test]
    fn wrapping_breaks_between_words() {
        assert_eq!(wrap("the quick brown fox", 10), ["the quick", "brown fox"]);
        // A space exactly at the edge: the row is full, the space dropped.
        assert_eq!(wrap("abcde fghij", 5), ["abcde", "fghij"]);
        // A word wider than a row still breaks, at the edge.
        assert_eq!(wrap("abcdefghijkl mn", 5), ["abcde", "fghij", "kl mn"]);
        assert_eq!(wrap("short", 10), ["short"]);
        // Columns, not bytes: two-column characters.
        assert_eq!(wrap("日本 語語語", 5), ["日本", "語語", "語"]);
        // Leading indentation is not a place to break.
        assert_eq!(wrap("    abcdefgh", 6), ["    ab", "cdefgh"]);
    }
}
