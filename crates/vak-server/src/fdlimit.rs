//! The open-files limit (RLIMIT_NOFILE): raised to its hard limit at startup, and the default cap on concurrent connections derived from it.

/// The most connections the default cap ever allows, however high the limit.
const CAP_CEILING: u64 = 65_536;

/// The current soft and hard RLIMIT_NOFILE, if the OS says.
pub fn nofile() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    // rlim_t is u64 on most targets, not all.
    #[allow(clippy::unnecessary_cast)]
    Some((lim.rlim_cur as u64, lim.rlim_max as u64))
}

/// Raises the soft open-files limit to the hard one. Returns (before, now),
/// or a sentence saying why it could not be read or raised.
pub fn raise_nofile() -> Result<(u64, u64), String> {
    let (soft, hard) = nofile().ok_or_else(|| std::io::Error::last_os_error().to_string())?;
    if soft >= hard {
        return Ok((soft, soft));
    }
    let lim = libc::rlimit {
        rlim_cur: hard as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "the open-files limit stays {soft}: cannot raise it to {hard}: {e}"
        ));
    }
    Ok((soft, hard))
}

/// The default `--max-connections`: three quarters of the open-files limit
/// (the rest is for ledgers, the TLS files and the like), at most 65 536.
pub fn default_max_connections() -> usize {
    let soft = nofile().map_or(1024, |(soft, _)| soft);
    cap_for(soft)
}

fn cap_for(nofile: u64) -> usize {
    let cap = (nofile / 4).saturating_mul(3).clamp(1, CAP_CEILING);
    usize::try_from(cap).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_a_quarter_of_the_descriptors_free() {
        assert_eq!(cap_for(1024), 768);
        assert_eq!(cap_for(20_000), 15_000);
        assert_eq!(cap_for(u64::MAX), 65_536);
        assert_eq!(cap_for(0), 1);
    }
}
