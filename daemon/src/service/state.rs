//! The daemon's own state: what the main loop publishes for the control
//! socket (the protocol's [`DaemonStatus`]) and what only it keeps beside
//! (the effective config's text). The socket reads it through
//! [`Published`]; it never names this type.

use std::{
    ops::{Deref, DerefMut},
    sync::Mutex,
};

use crate::control::{
    protocol::{ConfigReply, DaemonStatus, TopReply},
    server::{self, Published},
};

/// What the main loop publishes. Field access reads through to the
/// published status (`st.samples`, `st.top`), which is most of it.
#[derive(Debug, Clone, Default)]
pub struct DaemonState {
    pub status: DaemonStatus,
    /// The effective config as TOML (`vitalsctl config`), not in status.
    pub config_toml: String,
}

impl Deref for DaemonState {
    type Target = DaemonStatus;

    fn deref(&self) -> &DaemonStatus {
        &self.status
    }
}

impl DerefMut for DaemonState {
    fn deref_mut(&mut self) -> &mut DaemonStatus {
        &mut self.status
    }
}

impl Published for Mutex<DaemonState> {
    fn status(&self) -> DaemonStatus {
        self.lock().unwrap().status.clone()
    }

    fn top(&self, n: usize) -> TopReply {
        self.lock().unwrap().status.top_reply(n)
    }

    fn config(&self) -> ConfigReply {
        let st = self.lock().unwrap();
        ConfigReply {
            path: st.config_path.clone(),
            toml: st.config_toml.clone(),
        }
    }
}

/// The socket's shared part, as the daemon holds it (the server sees its
/// state as `dyn Published`).
pub type Shared = server::Shared<Mutex<DaemonState>>;
