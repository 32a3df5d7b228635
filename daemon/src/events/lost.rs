//! Capture losses per CPU: the programs' counters (by `cap::lost` kind)
//! with the perf buffers' own PERF_RECORD_LOST reports folded in.

use vitals_common::capture as cap;

pub(super) type LostCounts = [u64; cap::lost::COUNT as usize];

/// See `EventRecorder::merge_lost`. `kernel` and `base` are cumulative per-CPU
/// counters, `perf` per-CPU reports since `base`, charged to `kind`.
pub(super) fn merge_lost(
    mut kernel: Vec<LostCounts>,
    base: &[LostCounts],
    perf: &[u64],
    kind: u32,
) -> Vec<LostCounts> {
    if kernel.len() < perf.len() {
        kernel.resize(perf.len(), [0; cap::lost::COUNT as usize]);
    }
    let k = kind as usize;
    for (cpu, &reported) in perf.iter().enumerate() {
        let b = base.get(cpu).map_or(0, |b| b[k]);
        let seen = kernel[cpu][k].saturating_sub(b);
        kernel[cpu][k] = b + seen.max(reported);
    }
    kernel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_loss_reports_and_kernel_counter_count_the_same_drops_once() {
        let base = vec![[5, 1, 0, 0], [0, 0, 0, 0]];
        // cpu 0: counter saw 7 since base, perf reported 7 (same drops);
        // cpu 1: the perf report is ahead of the counter read;
        // cpu 2: only a report, no counter slot yet.
        let kernel = vec![[12, 1, 0, 0], [2, 0, 0, 0]];
        let merged = merge_lost(kernel, &base, &[7, 3, 4], cap::lost::SCHED);
        assert_eq!(merged, vec![[12, 1, 0, 0], [3, 0, 0, 0], [4, 0, 0, 0]]);
        // Fault-only captures charge reports to FAULT.
        let merged = merge_lost(vec![[0, 0, 0, 0]], &[], &[2], cap::lost::FAULT);
        assert_eq!(merged, vec![[0, 2, 0, 0]]);
    }
}
