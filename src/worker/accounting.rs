//! What a worker's steps add up to: the share of peak compute and memory
//! bandwidth asked, energy, and the rows of the `steps` table.

use super::{Worker, WorkerConfig};
use crate::ids::WorkerId;
use crate::metrics::{PeakSeconds, StepRow};
use crate::time::{SimDuration, SimTime};
use crate::worker::perf::{StepModel, StepWork};

/// What a worker's scheduler has done so far that its steps' rows count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StepCounts {
    /// Running requests preempted.
    pub(super) preemptions: u64,
    /// KV loads started.
    pub(super) kv_loads: u64,
    /// Tokens those loads bring.
    pub(super) kv_load_tokens: u64,
}

/// The rows of a worker's steps (see [`Worker::log_steps`]).
#[derive(Debug, Default)]
pub(super) struct StepLog {
    /// Steps done.
    pub(super) rows: Vec<StepRow>,
    /// The worker's counts when the last step started: a step's row gets
    /// what happened since.
    pub(super) counted: StepCounts,
    /// The step (or sub-step) in flight; its start and duration are set when it ends.
    pub(super) current: Option<StepRow>,
}

impl Worker {
    /// What the steps done so far asked of the GPU.
    pub fn peak_total(&self) -> PeakSeconds {
        self.peak_total
    }

    /// Joules per GPU of the steps done so far.
    pub fn step_joules(&self) -> f64 {
        self.step_j
    }

    /// Keeps a row per step from now on ([`Self::take_step_rows`]).
    pub fn log_steps(&mut self) {
        self.log.get_or_insert_with(Box::default);
    }

    /// Rows of steps done and not yet taken.
    pub fn step_rows_held(&self) -> usize {
        self.log.as_ref().map_or(0, |l| l.rows.len())
    }

    /// The rows of the steps done so far (empty unless [`Self::log_steps`]).
    pub fn take_step_rows(&mut self) -> Vec<StepRow> {
        self.log.as_mut().map(|l| std::mem::take(&mut l.rows)).unwrap_or_default()
    }

    /// The row of a step doing `work` (its times are set when it ends).
    pub(super) fn row_of(worker: WorkerId, work: &StepWork<'_>, cfg: &WorkerConfig) -> StepRow {
        let split = match &cfg.perf {
            // (A data-parallel rank's step is priced by its group: no split of its own.)
            StepModel::Operators(o) if cfg.data_parallel.is_none() => {
                let c = o.curves.cost(work);
                let k = &o.constants;
                let (_, cpu) = c.parts(k);
                Some([c.compute * k.compute_scale, c.memory * k.memory_scale, c.comm * k.comm_scale, cpu])
            }
            _ => None,
        };
        StepRow {
            worker: worker.0,
            start_s: 0.0,
            duration_s: 0.0,
            prefill_chunks: work.prefill.len() as u32,
            prefill_tokens: work.prefill.iter().map(|c| c.end - c.cached).sum(),
            prefill_cached_tokens: work.prefill.iter().map(|c| c.cached).sum(),
            decodes: work.decodes,
            decode_context_tokens: work.decode_context_tokens,
            preempted: 0,
            kv_loads: 0,
            kv_load_tokens: 0,
            kv_saved_tokens: 0,
            gpu_compute_s: split.map(|s| s[0]),
            gpu_memory_s: split.map(|s| s[1]),
            gpu_comm_s: split.map(|s| s[2]),
            cpu_s: split.map(|s| s[3]),
        }
    }

    /// `tokens` of KV went to the tiers at the end of the last step done
    /// (counted in its row, when steps are logged).
    pub fn log_saved(&mut self, tokens: u64) {
        if let Some(row) = self.log.as_mut().and_then(|l| l.rows.last_mut()) {
            row.kv_saved_tokens += tokens;
        }
    }

    /// A step starting now with `row`: it gets the preemptions and KV loads
    /// since the last one started.
    pub(super) fn log_start(&mut self, mut row: StepRow) {
        let now = self.counts;
        if let Some(log) = &mut self.log {
            let then = log.counted;
            row.preempted = (now.preemptions - then.preemptions) as u32;
            row.kv_loads = (now.kv_loads - then.kv_loads) as u32;
            row.kv_load_tokens = now.kv_load_tokens - then.kv_load_tokens;
            log.counted = now;
            log.current = Some(row);
        }
    }

    /// The step in flight ended at `end` after `duration`: its row is done.
    pub(super) fn log_end(&mut self, end: SimTime, duration: SimDuration) {
        if let Some(log) = &mut self.log
            && let Some(mut row) = log.current.take()
        {
            row.start_s = (end - duration).as_secs_f64();
            row.duration_s = duration.as_secs_f64();
            log.rows.push(row);
        }
    }
}
