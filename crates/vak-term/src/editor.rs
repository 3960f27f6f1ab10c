//! The prompt's line editor: the input being typed, its cursor, the usual Emacs-style keys, and the history of sent lines.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// What a key asks of the interactive loop, beyond editing the line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing to do but redraw (the line may have changed).
    Edited,
    /// Enter on a line with text: send it.
    Submit(String),
    /// Ctrl-C.
    Interrupt,
    /// Ctrl-D on an empty line.
    Eof,
    /// Ctrl-L.
    ClearScreen,
    /// A key the editor does not use.
    Ignored,
}

#[derive(Default)]
pub(crate) struct Editor {
    chars: Vec<char>,
    cursor: usize,
    history: Vec<String>,
    /// Where Up/Down is in the history, and the line that was being typed before.
    browsing: Option<usize>,
    draft: Vec<char>,
}

impl Editor {
    pub(crate) fn text(&self) -> String {
        self.chars.iter().collect()
    }

    pub(crate) fn cursor(&self) -> usize {
        self.cursor
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.chars.clear();
        self.cursor = 0;
        self.browsing = None;
    }

    pub(crate) fn insert_str(&mut self, s: &str) {
        for c in s.chars() {
            // A paste keeps its newlines (one prompt of several lines); other controls are dropped.
            let c = if c == '\r' { '\n' } else { c };
            if c == '\n' || !c.is_control() {
                self.chars.insert(self.cursor, c);
                self.cursor += 1;
            }
        }
    }

    fn set(&mut self, chars: Vec<char>) {
        self.cursor = chars.len();
        self.chars = chars;
    }

    fn word_start(&self) -> usize {
        let mut i = self.cursor;
        while i > 0 && self.chars[i - 1].is_whitespace() {
            i -= 1;
        }
        while i > 0 && !self.chars[i - 1].is_whitespace() {
            i -= 1;
        }
        i
    }

    pub(crate) fn key(&mut self, k: KeyEvent) -> Action {
        if k.kind == KeyEventKind::Release {
            return Action::Ignored;
        }
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        match k.code {
            KeyCode::Char('c') if ctrl => return Action::Interrupt,
            KeyCode::Char('d') if ctrl => {
                if self.chars.is_empty() {
                    return Action::Eof;
                }
                if self.cursor < self.chars.len() {
                    self.chars.remove(self.cursor);
                }
            }
            KeyCode::Char('l') if ctrl => return Action::ClearScreen,
            KeyCode::Char('a') if ctrl => self.cursor = 0,
            KeyCode::Char('e') if ctrl => self.cursor = self.chars.len(),
            KeyCode::Char('b') if ctrl => self.cursor = self.cursor.saturating_sub(1),
            KeyCode::Char('f') if ctrl => self.cursor = (self.cursor + 1).min(self.chars.len()),
            KeyCode::Char('u') if ctrl => {
                self.chars.drain(..self.cursor);
                self.cursor = 0;
            }
            KeyCode::Char('k') if ctrl => self.chars.truncate(self.cursor),
            KeyCode::Char('w') if ctrl => {
                let start = self.word_start();
                self.chars.drain(start..self.cursor);
                self.cursor = start;
            }
            KeyCode::Char('p') if ctrl => self.history_step(true),
            KeyCode::Char('n') if ctrl => self.history_step(false),
            KeyCode::Char(_) if ctrl => return Action::Ignored,
            KeyCode::Char(c) => self.insert_str(&c.to_string()),
            KeyCode::Enter => {
                let line = self.text();
                if line.trim().is_empty() {
                    return Action::Ignored;
                }
                if self.history.last() != Some(&line) {
                    self.history.push(line.clone());
                }
                self.clear();
                return Action::Submit(line);
            }
            KeyCode::Backspace => {
                if self.cursor > 0 {
                    self.cursor -= 1;
                    self.chars.remove(self.cursor);
                }
            }
            KeyCode::Delete => {
                if self.cursor < self.chars.len() {
                    self.chars.remove(self.cursor);
                }
            }
            KeyCode::Left => self.cursor = self.cursor.saturating_sub(1),
            KeyCode::Right => self.cursor = (self.cursor + 1).min(self.chars.len()),
            KeyCode::Home => self.cursor = 0,
            KeyCode::End => self.cursor = self.chars.len(),
            KeyCode::Up => self.history_step(true),
            KeyCode::Down => self.history_step(false),
            _ => return Action::Ignored,
        }
        Action::Edited
    }

    fn history_step(&mut self, back: bool) {
        let n = self.history.len();
        let next = match (self.browsing, back) {
            (None, true) if n > 0 => {
                self.draft = self.chars.clone();
                Some(n - 1)
            }
            (Some(i), true) => Some(i.saturating_sub(1)),
            (Some(i), false) if i + 1 < n => Some(i + 1),
            (Some(_), false) => {
                let draft = std::mem::take(&mut self.draft);
                self.set(draft);
                self.browsing = None;
                return;
            }
            _ => return,
        };
        self.browsing = next;
        if let Some(i) = next {
            self.set(self.history[i].chars().collect());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }
    fn ctrl(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
    }

    #[test]
    fn editing_keys_and_submit() {
        let mut e = Editor::default();
        assert_eq!(e.key(ctrl('d')), Action::Eof, "Ctrl-D on an empty line");
        e.insert_str("hello world");
        e.key(ctrl('w'));
        assert_eq!(e.text(), "hello ");
        e.key(key(KeyCode::Home));
        e.key(key(KeyCode::Char('>')));
        assert_eq!((e.text().as_str(), e.cursor()), (">hello ", 1));
        assert_eq!(
            e.key(ctrl('d')),
            Action::Edited,
            "Ctrl-D deletes when the line has text"
        );
        assert_eq!(e.text(), ">ello ");
        e.key(ctrl('u'));
        assert_eq!(e.text(), "ello ");
        assert_eq!(e.key(key(KeyCode::Enter)), Action::Submit("ello ".into()));
        assert!(e.is_empty());
        assert_eq!(
            e.key(key(KeyCode::Enter)),
            Action::Ignored,
            "an empty line is not sent"
        );
        assert_eq!(e.key(ctrl('c')), Action::Interrupt);
    }

    #[test]
    fn history_walks_back_and_returns_to_the_draft() {
        let mut e = Editor::default();
        for l in ["one", "two"] {
            e.insert_str(l);
            e.key(key(KeyCode::Enter));
        }
        e.insert_str("dra");
        e.key(key(KeyCode::Up));
        assert_eq!(e.text(), "two");
        e.key(key(KeyCode::Up));
        e.key(key(KeyCode::Up));
        assert_eq!(e.text(), "one");
        e.key(key(KeyCode::Down));
        e.key(key(KeyCode::Down));
        assert_eq!(e.text(), "dra");
    }
}
