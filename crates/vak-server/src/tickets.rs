//! One-time login links: a ticket, made for a holder of the token (`vak open`, `vak serve --print-token`), that logs one browser in once within a minute.
//!
//! The link carries the ticket in its fragment (`/app/#ticket=...`), which a
//! browser never sends to a server, so it reaches no access log and no
//! Referer; the page hands it to `POST /auth/login {"ticket"}`. Tickets are
//! kept as hashes in memory only (a restart ends them, they live a minute
//! anyway), at most `MAX_TICKETS` unexpired at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a ticket may wait to be used.
pub const TICKET_TTL: Duration = Duration::from_secs(60);
/// Tickets waiting at once; one more is refused until one is used or expires.
pub const MAX_TICKETS: usize = 16;

/// Why no ticket was made.
#[derive(Debug, PartialEq, Eq)]
pub enum TicketRefused {
    /// `MAX_TICKETS` are waiting.
    TooMany,
}

/// The waiting tickets, shared by the server's login routes and the command
/// line that prints a link at startup. Clones share one table.
#[derive(Clone, Default)]
pub struct Tickets {
    /// SHA-256 of the ticket (hex) -> when it expires.
    table: Arc<Mutex<HashMap<String, Instant>>>,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tickets")
    }
}

fn hash(ticket: &str) -> String {
    vak_core::host::files::sha256_hex(ticket.as_bytes())
}

impl Tickets {
    /// A new ticket, valid for `TICKET_TTL` from now.
    pub fn issue(&self) -> Result<String, TicketRefused> {
        self.issue_at(Instant::now())
    }

    /// Uses `ticket`: true once, within its minute; false for an unknown,
    /// used or expired one.
    pub fn redeem(&self, ticket: &str) -> bool {
        self.redeem_at(ticket, Instant::now())
    }

    fn issue_at(&self, now: Instant) -> Result<String, TicketRefused> {
        let ticket = vak_core::home::generate_token();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.retain(|_, expires| *expires > now);
        if table.len() >= MAX_TICKETS {
            return Err(TicketRefused::TooMany);
        }
        table.insert(hash(&ticket), now + TICKET_TTL);
        Ok(ticket)
    }

    fn redeem_at(&self, ticket: &str, now: Instant) -> bool {
        let key = hash(ticket);
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        // Removed whatever happens: a ticket is tried once.
        table.remove(&key).is_some_and(|expires| expires > now)
    }
}

/// The path of the login link for `ticket`, to append to the server's URL.
pub fn link_path(ticket: &str) -> String {
    format!("/app/#ticket={ticket}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_logs_in_once_and_only_within_its_minute() {
        let t = Tickets::default();
        let now = Instant::now();
        let once = t.issue_at(now).unwrap();
        assert!(!t.redeem_at("not-a-ticket", now));
        assert!(t.redeem_at(&once, now + Duration::from_secs(59)));
        assert!(!t.redeem_at(&once, now + Duration::from_secs(59)), "used");
        let late = t.issue_at(now).unwrap();
        assert!(!t.redeem_at(&late, now + TICKET_TTL), "expired at 60 s");
    }

    #[test]
    fn at_most_max_tickets_wait_and_expired_ones_make_room() {
        let t = Tickets::default();
        let now = Instant::now();
        let first: Vec<String> = (0..MAX_TICKETS).map(|_| t.issue_at(now).unwrap()).collect();
        assert_eq!(t.issue_at(now), Err(TicketRefused::TooMany));
        assert!(t.redeem_at(&first[0], now), "a waiting ticket still works");
        assert!(t.issue_at(now).is_ok(), "a used one makes room");
        assert!(t.issue_at(now + TICKET_TTL).is_ok(), "so do expired ones");
        assert!(!t.redeem_at(&first[1], now + TICKET_TTL));
    }

    #[test]
    fn the_table_keeps_hashes_not_tickets() {
        let t = Tickets::default();
        let ticket = t.issue().unwrap();
        let table = t.table.lock().unwrap();
        assert!(!table.contains_key(&ticket));
        assert!(table.contains_key(&hash(&ticket)));
    }
}
