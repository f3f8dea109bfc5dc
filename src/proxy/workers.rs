//! `server.threading = "per_core"`: one single-threaded event loop per worker thread, each
//! accepting from the same listening socket and serving its connections start to end.
//!
//! Why: with tokio's work-stealing pool a frame's journey (upstream socket readable, hyper's
//! client connection task, the egress body in the server connection task, the client socket
//! write) can hop between threads, and an idle thread is woken with a futex to steal work. Here a
//! connection, its requests, their upstream connections (from the worker's own pool) and every
//! task they spawn stay on the thread that accepted it: no cross-thread wake-up per frame.
//!
//! Every worker registers a duplicate of the one listening socket with its own event loop and
//! accepts from the one accept queue, so whichever worker is idle takes the next connection (as
//! nginx's workers do without `reuseport`). The port is bound once: a second metronome on the
//! same port fails with "address in use" rather than silently sharing it, as SO_REUSEPORT would.

use std::io;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::{listener, ProxyState};

/// Starts `count` worker threads serving `listener`, each until `stop` turns true (or its sender
/// is dropped) and its connections have drained. The returned task ends when every worker has.
///
/// Everything that can fail (the event loops, the socket duplicates) is set up before the first
/// thread starts, so a failure here leaves nothing running.
pub fn spawn(
    listener: TcpListener,
    state: Arc<ProxyState>,
    stop: watch::Receiver<bool>,
    count: usize,
) -> io::Result<JoinHandle<()>> {
    let listener = listener.into_std()?;
    let mut ready = Vec::with_capacity(count);
    for _ in 0..count {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Registered with this worker's own event loop.
        let socket = {
            let _context = runtime.enter();
            TcpListener::from_std(listener.try_clone()?)?
        };
        ready.push((runtime, socket));
    }
    let mut finished = Vec::with_capacity(count);
    for (index, (runtime, socket)) in ready.into_iter().enumerate() {
        let (done, done_rx) = oneshot::channel::<()>();
        let state = state.clone();
        let stop = stop.clone();
        // Should this fail, the threads already started stop when the caller drops the sender
        // of `stop`, as it does on this error.
        std::thread::Builder::new()
            .name(format!("metronome-worker-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let client = state.upstream_client();
                    listener::serve(socket, state, client, stopped(stop)).await;
                });
                // Dropping the event loop closes the connections still open after the drain.
                drop(runtime);
                let _ = done.send(());
            })?;
        finished.push(done_rx);
    }
    Ok(tokio::spawn(async move {
        for worker in finished {
            // An error means the worker's thread ended without saying so (a panic): done too.
            let _ = worker.await;
        }
    }))
}

/// Resolves once `stop` is true or its sender is gone: the stop signal of every listener.
pub(super) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
