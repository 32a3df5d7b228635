//! Processes that start during an off-CPU capture with a name the watch
//! follows (`capture.offcpu_watch`) join its `OFFCPU_WATCH` set.

use std::collections::HashSet;

use super::{
    offcpu_watch::{OffcpuWatch, WatchedProcesses},
    transport, EventRecorder, EventsError,
};
use crate::bpf::Accounting;

/// A running capture's names to follow and the tgids it watches.
#[derive(Debug, Default)]
pub(super) struct Follow {
    names: Vec<String>,
    watched: HashSet<u32>,
}

impl Follow {
    pub(super) fn of(watch: Option<&OffcpuWatch>) -> Self {
        match watch {
            Some(OffcpuWatch {
                processes: WatchedProcesses::Tgids(tgids),
                follow_names,
                ..
            }) => Self {
                names: follow_names.clone(),
                watched: tgids.iter().copied().collect(),
            },
            _ => Self::default(),
        }
    }
}

impl EventRecorder {
    /// Processes first seen during the capture, as (tgid, name matched
    /// like a rule's `process`): those the off-CPU watch follows by name
    /// join it from now on.
    pub fn follow_new_processes<'a>(
        &mut self,
        acc: &mut Accounting,
        new: impl IntoIterator<Item = (u32, &'a str)>,
    ) -> Result<(), EventsError> {
        let f = &mut self.offcpu_follow;
        if f.names.is_empty() {
            return Ok(());
        }
        let join: Vec<u32> = new
            .into_iter()
            .filter(|(tgid, name)| f.names.iter().any(|n| n == name) && !f.watched.contains(tgid))
            .map(|(tgid, _)| tgid)
            .collect();
        if join.is_empty() {
            return Ok(());
        }
        let dropped = transport::watch_more(acc, &join)?;
        f.watched.extend(&join);
        log::info!("capture: off-CPU watch joined by pids {join:?} (started during it)");
        self.stats.offcpu_watched_later += join.len() as u64 - dropped;
        self.stats.offcpu_watch_dropped += dropped;
        Ok(())
    }
}
