//! ProcessCpuTracker-style deltas: the one place counters become deltas.
