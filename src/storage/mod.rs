//! Storage devices with bandwidth shared by processor sharing.
//!
//! An operation first waits (FIFO) for one of `concurrency` slots, then pays
//! the device's per-operation `latency`, then transfers its bytes while
//! sharing bandwidth fairly with every other transfer in progress: with `n`
//! transfers each gets `B/n`; with a per-client link cap (a worker's NIC on
//! the shared distributed file system) the shares are max-min fair. The slot
//! is held through latency and transfer.
//!
//! The device is passive: it takes `now` and reports timers to schedule and
//! operations that completed. Transfer completions are exact: every start or
//! finish re-plans the rates and the next completion, which is stamped with a
//! version so that superseded timers are ignored.

use crate::engine::Version;
use crate::time::{SimDuration, SimTime};
use std::collections::VecDeque;

/// An operation, numbered by the caller (unique among the device's live ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u32);

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Bytes out of the device.
    Read,
    /// Bytes into the device.
    Write,
}

/// A device's performance parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceConfig {
    /// Aggregate bandwidth, bytes per second.
    pub bandwidth_bps: f64,
    /// Per-operation latency.
    pub latency: SimDuration,
    /// Operations in service (latency or transfer) at once.
    pub concurrency: u32,
    /// Per-client bandwidth cap, bytes per second (None: no cap).
    pub client_bandwidth_bps: Option<f64>,
}

/// A timer the device wants scheduled; hand it back to [`Device::on_timer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceTimer {
    /// The latency of an operation is over.
    LatencyDone(OpId),
    /// The next transfer completion, as planned under `version`.
    Transfer(u32),
}

/// A finished operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    /// Which.
    pub op: OpId,
    /// Read or write.
    pub kind: OpKind,
    /// Bytes moved.
    pub bytes: u64,
}

/// What a call produced.
#[derive(Debug, Default)]
pub struct DeviceOutput {
    /// Timers to schedule.
    pub timers: Vec<(SimTime, DeviceTimer)>,
    /// Operations that finished.
    pub completed: Vec<Completed>,
}

impl DeviceOutput {
    /// Empties both lists.
    pub fn clear(&mut self) {
        self.timers.clear();
        self.completed.clear();
    }
}

/// Counters of a device.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceStats {
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Operations completed.
    pub ops: u64,
    /// Time with at least one operation in service.
    pub busy: SimDuration,
    /// Total time operations waited for a slot.
    pub queue_wait: SimDuration,
    /// Most transfers in progress at once.
    pub peak_active: u32,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    id: OpId,
    kind: OpKind,
    bytes: u64,
    client: u32,
    submitted: SimTime,
}

#[derive(Clone, Copy, Debug)]
struct Transfer {
    op: Op,
    /// Bytes still to move as of `Device::last`.
    remaining: f64,
    /// Bytes per nanosecond under the current plan.
    rate: f64,
}

/// One storage device.
#[derive(Debug)]
pub struct Device {
    cfg: DeviceConfig,
    /// Bandwidth in bytes per nanosecond.
    bw: f64,
    cap: Option<f64>,
    waiting: VecDeque<Op>,
    /// Operations in their access latency, in the order they started: the
    /// latency is the device's own, so they leave it in that order too.
    in_latency: VecDeque<Op>,
    active: Vec<Transfer>,
    /// Time up to which `active[..].remaining` is accounted.
    last: SimTime,
    version: Version,
    busy_since: Option<SimTime>,
    stats: DeviceStats,
}

impl Device {
    /// An idle device.
    pub fn new(cfg: DeviceConfig) -> Device {
        assert!(cfg.bandwidth_bps > 0.0 && cfg.concurrency >= 1, "device config was validated");
        Device {
            bw: cfg.bandwidth_bps / 1e9,
            cap: cfg.client_bandwidth_bps.map(|c| c / 1e9),
            cfg,
            waiting: VecDeque::new(),
            in_latency: VecDeque::new(),
            active: Vec::new(),
            last: SimTime::ZERO,
            version: Version::default(),
            busy_since: None,
            stats: DeviceStats::default(),
        }
    }

    /// Its counters (busy time up to the last event).
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// Its counters with busy time accounted up to `now`.
    pub fn stats_at(&self, now: SimTime) -> DeviceStats {
        let mut s = self.stats;
        if let Some(since) = self.busy_since {
            s.busy += now.saturating_since(since);
        }
        s
    }

    /// Operations in service or waiting.
    pub fn outstanding(&self) -> usize {
        self.waiting.len() + self.in_latency.len() + self.active.len()
    }

    fn in_service(&self) -> usize {
        self.in_latency.len() + self.active.len()
    }

    fn set_busy(&mut self, now: SimTime) {
        match (self.busy_since, self.in_service() > 0) {
            (None, true) => self.busy_since = Some(now),
            (Some(since), false) => {
                self.stats.busy += now - since;
                self.busy_since = None;
            }
            _ => {}
        }
    }

    /// Submits an operation of `bytes` for `client` (a worker id) at `now`.
    pub fn submit(&mut self, now: SimTime, id: OpId, kind: OpKind, bytes: u64, client: u32, out: &mut DeviceOutput) {
        let op = Op { id, kind, bytes, client, submitted: now };
        if self.in_service() < self.cfg.concurrency as usize && self.waiting.is_empty() {
            self.start(now, op, out);
        } else {
            self.waiting.push_back(op);
        }
    }

    /// Handles a timer this device asked for.
    pub fn on_timer(&mut self, now: SimTime, timer: DeviceTimer, out: &mut DeviceOutput) {
        match timer {
            DeviceTimer::LatencyDone(id) => {
                // The first to have started, unless timers due at one instant
                // come in another order (then a short search).
                let at = self.in_latency.iter().position(|o| o.id == id);
                let op = at.and_then(|i| self.in_latency.remove(i)).expect("latency timer for an operation in latency");
                self.begin_transfer(now, op, out);
            }
            DeviceTimer::Transfer(v) => {
                if !self.version.is_current(v) {
                    return; // superseded by a re-plan
                }
                self.advance(now);
                let mut i = 0;
                let mut finished = false;
                while i < self.active.len() {
                    let t = self.active[i];
                    // Done if less than one nanosecond's worth of bytes is left
                    // (completion times are rounded up to whole nanoseconds).
                    if t.remaining <= t.rate.max(1e-9) {
                        self.active.swap_remove(i);
                        self.finish(t.op, out);
                        finished = true;
                    } else {
                        i += 1;
                    }
                }
                debug_assert!(finished || self.active.is_empty(), "a transfer timer fired with nothing finishing");
                self.fill_slots(now, out);
                self.replan(now, out);
                self.set_busy(now);
            }
        }
    }

    fn start(&mut self, now: SimTime, op: Op, out: &mut DeviceOutput) {
        self.stats.queue_wait += now - op.submitted;
        if self.cfg.latency.0 == 0 {
            self.begin_transfer(now, op, out);
        } else {
            self.in_latency.push_back(op);
            out.timers.push((now + self.cfg.latency, DeviceTimer::LatencyDone(op.id)));
            self.set_busy(now);
        }
    }

    fn begin_transfer(&mut self, now: SimTime, op: Op, out: &mut DeviceOutput) {
        if op.bytes == 0 {
            self.finish(op, out);
            self.fill_slots(now, out);
            self.set_busy(now);
            return;
        }
        self.advance(now);
        self.active.push(Transfer { op, remaining: op.bytes as f64, rate: 0.0 });
        self.stats.peak_active = self.stats.peak_active.max(self.active.len() as u32);
        self.replan(now, out);
        self.set_busy(now);
    }

    fn finish(&mut self, op: Op, out: &mut DeviceOutput) {
        match op.kind {
            OpKind::Read => self.stats.bytes_read += op.bytes,
            OpKind::Write => self.stats.bytes_written += op.bytes,
        }
        self.stats.ops += 1;
        out.completed.push(Completed { op: op.id, kind: op.kind, bytes: op.bytes });
    }

    fn fill_slots(&mut self, now: SimTime, out: &mut DeviceOutput) {
        while self.in_service() < self.cfg.concurrency as usize {
            let Some(op) = self.waiting.pop_front() else { break };
            self.start(now, op, out);
        }
    }

    /// Moves every transfer forward to `now` at its current rate.
    fn advance(&mut self, now: SimTime) {
        let dt = (now - self.last).0 as f64;
        if dt > 0.0 {
            for t in &mut self.active {
                t.remaining -= t.rate * dt;
            }
        }
        self.last = now;
    }

    /// Recomputes max-min fair rates and schedules the next completion.
    fn replan(&mut self, now: SimTime, out: &mut DeviceOutput) {
        let v = self.version.bump();
        if self.active.is_empty() {
            return;
        }
        self.assign_rates();
        let next = self.active.iter().map(|t| (t.remaining.max(0.0) / t.rate).ceil()).fold(f64::INFINITY, f64::min);
        let delay = SimDuration((next as u64).max(1));
        out.timers.push((now + delay, DeviceTimer::Transfer(v)));
    }

    /// Equal shares, except that clients whose transfers would together
    /// exceed the per-client cap get the cap split among them; the
    /// bandwidth they leave is shared by the rest (water-filling).
    fn assign_rates(&mut self) {
        let n = self.active.len();
        let Some(cap) = self.cap else {
            let r = self.bw / n as f64;
            self.active.iter_mut().for_each(|t| t.rate = r);
            return;
        };
        let mut clients: Vec<(u32, usize)> = Vec::new();
        for t in &self.active {
            match clients.iter_mut().find(|(c, _)| *c == t.op.client) {
                Some(e) => e.1 += 1,
                None => clients.push((t.op.client, 1)),
            }
        }
        // Clients with more transfers hit the cap first.
        clients.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut bw = self.bw;
        let mut left = n;
        let mut capped: Vec<(u32, f64)> = Vec::new();
        let mut share = bw / left as f64;
        for &(c, k) in &clients {
            if k as f64 * share > cap {
                capped.push((c, cap / k as f64));
                bw -= cap;
                left -= k;
                share = if left > 0 { bw / left as f64 } else { 0.0 };
            } else {
                break;
            }
        }
        for t in &mut self.active {
            t.rate = capped.iter().find(|(c, _)| *c == t.op.client).map_or(share, |&(_, r)| r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 GB/s = 1 byte per ns makes the arithmetic readable.
    fn device(latency_ns: u64, concurrency: u32, cap_bps: Option<f64>) -> Device {
        Device::new(DeviceConfig {
            bandwidth_bps: 1e9,
            latency: SimDuration(latency_ns),
            concurrency,
            client_bandwidth_bps: cap_bps,
        })
    }

    /// Drives a device through its own timers; returns (op, completion time) in completion order.
    fn drive(dev: &mut Device, submissions: &[(u64, u32, u64, u32)]) -> Vec<(u32, u64)> {
        let mut timers: Vec<(SimTime, DeviceTimer)> = Vec::new();
        let mut done = Vec::new();
        let mut out = DeviceOutput::default();
        let mut subs: VecDeque<_> = submissions.iter().copied().collect();
        loop {
            let next_timer = timers.iter().map(|t| t.0).min();
            let next_sub = subs.front().map(|s| SimTime(s.0));
            let now = match (next_timer, next_sub) {
                (None, None) => break,
                (Some(t), Some(s)) => t.min(s),
                (Some(t), None) => t,
                (None, Some(s)) => s,
            };
            out.clear();
            if next_sub == Some(now) && next_timer.is_none_or(|t| t > now) {
                let (_, id, bytes, client) = subs.pop_front().unwrap();
                dev.submit(now, OpId(id), OpKind::Read, bytes, client, &mut out);
            } else {
                let i = timers.iter().position(|t| t.0 == now).unwrap();
                let (_, timer) = timers.remove(i);
                dev.on_timer(now, timer, &mut out);
            }
            timers.extend(out.timers.iter().copied());
            done.extend(out.completed.iter().map(|c| (c.op.0, now.0)));
        }
        done
    }

    #[test]
    fn two_transfers_starting_together_share_bandwidth_equally() {
        // 1000 B each at 1 B/ns shared: 0.5 B/ns each → both finish at 2000 ns.
        let mut d = device(0, 10, None);
        assert_eq!(drive(&mut d, &[(0, 1, 1000, 0), (0, 2, 1000, 0)]), vec![(1, 2000), (2, 2000)]);
        assert_eq!(d.stats().bytes_read, 2000);
        assert_eq!(d.stats().busy, SimDuration(2000));
        assert_eq!(d.stats().peak_active, 2);
    }

    #[test]
    fn a_third_transfer_arriving_midway_replans_both() {
        // At 1000 ns ops 1 and 2 have 500 B left; three share 1/3 B/ns:
        // ops 1, 2 finish at 1000 + 500·3 = 2500. Op 3 has moved 500 B by then
        // and finishes its last 500 B alone at 3000.
        let mut d = device(0, 10, None);
        let done = drive(&mut d, &[(0, 1, 1000, 0), (0, 2, 1000, 0), (1000, 3, 1000, 0)]);
        assert_eq!(done, vec![(1, 2500), (2, 2500), (3, 3000)]);
    }

    #[test]
    fn the_concurrency_limit_queues_the_fourth_operation() {
        // Concurrency 3: as above, op 4 (at 1000 ns) waits for a slot until 2500,
        // then shares with op 3 (500 B left): 0.5 B/ns each; op 3 done at 3500,
        // op 4 has 500 B left and finishes alone at 4000.
        let mut d = device(0, 3, None);
        let done = drive(&mut d, &[(0, 1, 1000, 0), (0, 2, 1000, 0), (1000, 3, 1000, 0), (1000, 4, 1000, 0)]);
        assert_eq!(done, vec![(1, 2500), (2, 2500), (3, 3500), (4, 4000)]);
        assert_eq!(d.stats().queue_wait, SimDuration(1500));
    }

    #[test]
    fn latency_is_paid_once_per_operation_before_its_transfer() {
        // 100 ns latency, then 1000 B alone: done at 1100. A second op at 0
        // also pays 100 ns, then they share: both finish at 100 + 2000.
        let mut d = device(100, 10, None);
        assert_eq!(drive(&mut d, &[(0, 1, 1000, 0)]), vec![(1, 1100)]);
        let mut d = device(100, 10, None);
        assert_eq!(drive(&mut d, &[(0, 1, 1000, 0), (0, 2, 1000, 0)]), vec![(1, 2100), (2, 2100)]);
        // A zero-byte op costs exactly the latency.
        let mut d = device(100, 10, None);
        assert_eq!(drive(&mut d, &[(5, 9, 0, 0)]), vec![(9, 105)]);
    }

    #[test]
    fn max_min_fair_sharing_with_a_per_client_cap() {
        // 1 B/ns total, per-client cap 0.3 B/ns. Client 0 has two transfers,
        // client 1 one. Equal shares would be 1/3 each; client 0 would take
        // 2/3 > 0.3, so it is capped at 0.15 B/ns per transfer; client 1 then
        // could have the remaining 0.7 but is capped at 0.3.
        let mut d = device(0, 10, Some(0.3e9));
        let mut out = DeviceOutput::default();
        d.submit(SimTime(0), OpId(1), OpKind::Read, 300, 0, &mut out);
        d.submit(SimTime(0), OpId(2), OpKind::Read, 300, 0, &mut out);
        d.submit(SimTime(0), OpId(3), OpKind::Read, 300, 1, &mut out);
        let rates: Vec<f64> = d.active.iter().map(|t| t.rate).collect();
        assert_eq!(rates, vec![0.15, 0.15, 0.3]);
        // Op 3 (300 B at 0.3) ends at 1000 ns; ops 1, 2 (0.15) at 2000 ns.
        let mut d = device(0, 10, Some(0.3e9));
        let done = drive(&mut d, &[(0, 1, 300, 0), (0, 2, 300, 0), (0, 3, 300, 1)]);
        assert_eq!(done, vec![(3, 1000), (1, 2000), (2, 2000)]);
        // A generous cap changes nothing: three equal shares.
        let mut d = device(0, 10, Some(0.8e9));
        d.submit(SimTime(0), OpId(1), OpKind::Read, 300, 0, &mut out);
        d.submit(SimTime(0), OpId(2), OpKind::Read, 300, 0, &mut out);
        d.submit(SimTime(0), OpId(3), OpKind::Read, 300, 1, &mut out);
        assert!(d.active.iter().all(|t| (t.rate - 1.0 / 3.0).abs() < 1e-15));
    }
}
