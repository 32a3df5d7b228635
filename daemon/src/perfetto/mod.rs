//! Perfetto trace writer.
