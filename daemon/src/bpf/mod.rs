//! Loading, attaching and reading the eBPF accounting programs.
