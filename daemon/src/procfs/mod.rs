//! procfs readers, one per kernel file. Each takes an injectable root.
