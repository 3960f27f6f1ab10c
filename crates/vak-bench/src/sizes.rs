//! Every size the scenarios use: the full bench's, `--quick`'s, and what the flags override.

use crate::realistic::LoadSize;
use crate::scenarios::Transport;
use crate::{cluster, memory, Args};

/// Every size the scenarios use.
#[derive(Clone, Debug)]
pub(crate) struct Sizes {
    pub(crate) runs: usize,
    pub(crate) fanout_subs: Vec<usize>,
    pub(crate) burst: u64,
    pub(crate) latency_subs: usize,
    /// The curve's rates, events/s; each paced for `latency_secs`.
    pub(crate) latency_rates: Vec<u64>,
    pub(crate) latency_secs: f64,
    /// Bisection steps between the curve's rates where p99 crosses 10 ms.
    pub(crate) cross_steps: usize,
    /// The growth table: subscribers of one session, sessions of one
    /// subscriber each, and delta sizes (to `growth_size_subs` subscribers).
    pub(crate) growth_subs: Vec<usize>,
    pub(crate) growth_sessions: Vec<usize>,
    pub(crate) growth_sizes: Vec<u64>,
    pub(crate) growth_size_subs: usize,
    /// Deliveries each growth point aims at (subscribers x deltas), the
    /// fewest deltas a point sends, and the bytes a size point delivers.
    pub(crate) growth_deliveries: u64,
    pub(crate) growth_min_events: u64,
    /// Deltas each session of a sessions point gets at least: a run's own
    /// work (its turn, receipts, search indexing) is the same however many
    /// deltas it streams, so points with fewer deltas per run would show
    /// that fixed cost as a per-event cost growing with the sessions.
    pub(crate) growth_session_deltas: u64,
    pub(crate) growth_size_bytes: u64,
    pub(crate) growth_runs: usize,
    pub(crate) cluster: cluster::ClusterSizes,
    pub(crate) sessions: usize,
    pub(crate) session_burst: u64,
    pub(crate) idle: usize,
    pub(crate) stalled_subs: usize,
    pub(crate) stall_burst: u64,
    pub(crate) fsync_subs: Vec<usize>,
    /// The replay scenario's (transport, sessions, history) runs.
    pub(crate) replay: Vec<(Transport, usize, u64)>,
    pub(crate) replay_runs: usize,
    pub(crate) search_sessions: usize,
    pub(crate) search_queries: usize,
    /// The memory scenario (memory.rs) and its runs.
    pub(crate) memory: memory::MemorySizes,
    pub(crate) memory_runs: usize,
    /// The realistic-load scenario's points (realistic.rs).
    pub(crate) realistic: Vec<LoadSize>,
}

impl Sizes {
    pub(crate) fn full() -> Sizes {
        Sizes {
            runs: 3,
            fanout_subs: vec![1, 100, 1000],
            burst: 100_000,
            latency_subs: 1000,
            latency_rates: vec![1000, 3000, 10_000],
            latency_secs: 2.0,
            cross_steps: 3,
            growth_subs: vec![1, 10, 100, 1000, 10_000],
            growth_sessions: vec![1, 100, 1000, 10_000],
            growth_sizes: vec![16, 1024, 64 * 1024],
            growth_size_subs: 10,
            growth_deliveries: 2_000_000,
            growth_min_events: 100,
            growth_session_deltas: 1000,
            growth_size_bytes: 256 << 20,
            growth_runs: 1,
            cluster: cluster::ClusterSizes {
                subs: 1000,
                burst: 5000,
                pace: 2000,
                rate: 1000,
                // Long enough that the embedded server's run (about 0.3 s)
                // is not mostly noise: at 100 000 it lasted 30-65 ms and the
                // paired ratio went from 23% to 40% run to run.
                one_burst: 1_000_000,
            },
            sessions: 1000,
            session_burst: 2_000,
            idle: 10_000,
            stalled_subs: 100,
            stall_burst: 100_000,
            fsync_subs: vec![1],
            replay: vec![(Transport::Sse, 100, 100_000), (Transport::Grpc, 100, 100_000)],
            replay_runs: 1,
            search_sessions: 1000,
            search_queries: 200,
            memory: memory::MemorySizes::full(),
            memory_runs: 1,
            realistic: vec![
                LoadSize::GOAL,
                LoadSize {
                    sessions: 1000,
                    rate: 200,
                    readers: 2,
                    secs: 10.0,
                },
            ],
        }
    }

    pub(crate) fn quick() -> Sizes {
        Sizes {
            runs: 1,
            fanout_subs: vec![1, 10, 50],
            burst: 10_000,
            latency_subs: 50,
            latency_rates: vec![1000, 3000, 10_000],
            latency_secs: 0.05,
            cross_steps: 1,
            growth_subs: vec![1, 10, 30],
            growth_sessions: vec![1, 10, 20],
            growth_sizes: vec![16, 1024, 64 * 1024],
            growth_size_subs: 3,
            growth_deliveries: 5_000,
            growth_min_events: 20,
            growth_session_deltas: 20,
            growth_size_bytes: 1 << 20,
            growth_runs: 1,
            cluster: cluster::ClusterSizes {
                subs: 9,
                burst: 300,
                pace: 100,
                rate: 1000,
                one_burst: 2000,
            },
            sessions: 50,
            session_burst: 2_000,
            idle: 200,
            stalled_subs: 10,
            stall_burst: 10_000,
            fsync_subs: vec![1],
            replay: vec![(Transport::Sse, 5, 10_000), (Transport::Grpc, 1, 3_000)],
            replay_runs: 1,
            search_sessions: 20,
            search_queries: 20,
            memory: memory::MemorySizes::quick(),
            memory_runs: 1,
            realistic: vec![LoadSize {
                sessions: 50,
                rate: 50,
                readers: 2,
                secs: 2.0,
            }],
        }
    }

    /// The sizes of `--quick` or the full bench, with what the flags override.
    pub(crate) fn of(args: &Args) -> Sizes {
        let mut sizes = if args.quick { Sizes::quick() } else { Sizes::full() };
        if let Some(r) = args.runs {
            sizes.runs = r.max(1);
        }
        if !args.subs.is_empty() {
            sizes.fanout_subs = args.subs.clone();
        }
        sizes.burst = args.burst.unwrap_or(sizes.burst);
        sizes.stall_burst = args.stall_burst.or(args.burst).unwrap_or(sizes.stall_burst);
        sizes.sessions = args.sessions.unwrap_or(sizes.sessions);
        sizes.session_burst = args.session_burst.unwrap_or(sizes.session_burst);
        sizes.idle = args.idle.unwrap_or(sizes.idle);
        sizes.latency_subs = args.latency_subs.unwrap_or(sizes.latency_subs);
        if !args.latency_rates.is_empty() {
            sizes.latency_rates = args.latency_rates.iter().copied().filter(|&r| r > 0).collect();
        }
        sizes.latency_secs = args.latency_secs.unwrap_or(sizes.latency_secs).max(0.01);
        sizes.growth_runs = args.growth_runs.unwrap_or(sizes.growth_runs).max(1);
        if !(args.growth_subs.is_empty() && args.growth_sessions.is_empty() && args.growth_sizes.is_empty()) {
            sizes.growth_subs = args.growth_subs.iter().copied().filter(|&n| n > 0).collect();
            sizes.growth_sessions = args.growth_sessions.iter().copied().filter(|&n| n > 0).collect();
            sizes.growth_sizes = args.growth_sizes.iter().copied().filter(|&n| n > 0).collect();
        }
        sizes.cluster.subs = args.cluster_subs.unwrap_or(sizes.cluster.subs).max(1);
        if !args.fsync_subs.is_empty() {
            sizes.fsync_subs = args.fsync_subs.iter().copied().filter(|&n| n > 0).collect();
        }
        for (_, sessions, history) in &mut sizes.replay {
            *sessions = args.replay_sessions.unwrap_or(*sessions);
            *history = args.replay_history.unwrap_or(*history);
        }
        sizes.replay_runs = args.replay_runs.or(args.runs).unwrap_or(sizes.replay_runs).max(1);
        sizes.search_sessions = args.search_sessions.unwrap_or(sizes.search_sessions).max(1);
        sizes.search_queries = args.search_queries.unwrap_or(sizes.search_queries).max(1);
        sizes.memory_runs = args.memory_runs.unwrap_or(sizes.memory_runs).max(1);
        realistic_of(args, &mut sizes.realistic);
        sizes
    }
}

/// `--realistic-sessions/-rate/-readers` make the realistic scenario one
/// point (what is not given comes from its first default point);
/// `--realistic-secs` sets every point's duration.
fn realistic_of(args: &Args, points: &mut Vec<LoadSize>) {
    if args.realistic_sessions.is_some() || args.realistic_rate.is_some() || args.realistic_readers.is_some()
    {
        let first = points.first().copied().unwrap_or(LoadSize::GOAL);
        *points = vec![LoadSize {
            sessions: args.realistic_sessions.unwrap_or(first.sessions).max(1),
            rate: args.realistic_rate.unwrap_or(first.rate).max(1),
            readers: args.realistic_readers.unwrap_or(first.readers).max(1),
            secs: first.secs,
        }];
    }
    if let Some(secs) = args.realistic_secs {
        for p in points.iter_mut() {
            p.secs = secs.max(0.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn realistic_flags_make_one_point_from_the_defaults() {
        let full = Sizes::of(&Args::parse_from(["vak-bench"]));
        assert_eq!(full.realistic.len(), 2);
        assert_eq!(full.realistic[0], LoadSize::GOAL);
        let a = Args::parse_from([
            "vak-bench",
            "--realistic-sessions",
            "2000",
            "--realistic-secs",
            "5",
        ]);
        let s = Sizes::of(&a);
        assert_eq!(
            s.realistic,
            [LoadSize {
                sessions: 2000,
                secs: 5.0,
                ..LoadSize::GOAL
            }]
        );
        let q = Sizes::of(&Args::parse_from([
            "vak-bench",
            "--quick",
            "--realistic-secs",
            "1",
        ]));
        assert_eq!((q.realistic[0].sessions, q.realistic[0].secs), (50, 1.0));
    }
}
