//! The two HTTP/1.1 implementations a deployment chooses between (`server.upstream_client` and
//! `server.http1_server`): settings, so they live with the configuration and the proxy reads them.

/// Which client plain-http upstreams go through (`server.upstream_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// metronome's own HTTP/1.1 client: one task per frame.
    Native,
    /// hyper-util's client for every upstream.
    Hyper,
}

// === impl ClientKind ===

impl ClientKind {
    /// The value as `server.upstream_client` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Native => "native",
            ClientKind::Hyper => "hyper",
        }
    }

    /// Reads `server.upstream_client`.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "native" => Ok(ClientKind::Native),
            "hyper" => Ok(ClientKind::Hyper),
            other => Err(format!(
                "{other:?} is not a client; expected \"native\" or \"hyper\""
            )),
        }
    }
}

/// Which HTTP/1.1 server serves client connections (`server.http1_server`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// metronome's own (`http1::server`).
    Native,
    /// hyper's.
    Hyper,
}

// === impl ServerKind ===

impl ServerKind {
    /// The value as `server.http1_server` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Native => "native",
            ServerKind::Hyper => "hyper",
        }
    }

    /// Reads `server.http1_server`.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "native" => Ok(ServerKind::Native),
            "hyper" => Ok(ServerKind::Hyper),
            other => Err(format!(
                "{other:?} is not a server; expected \"native\" or \"hyper\""
            )),
        }
    }
}
