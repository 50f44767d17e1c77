//! LISTEN poimen_work: the wake-ups of a serving host on PostgreSQL. The
//! store's SQL sends `NOTIFY poimen_work` when a transaction may have made a
//! run claimable (see `schema_v1.sql`); one connection of this process,
//! outside the pool, listens and rings the process's [`Wakeup`]. Started on
//! the first wait, so a process that never serves opens no extra
//! connection; reconnects after the server or the network drops it (a
//! ring on reconnecting: what was sent meanwhile is not replayed).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{AsyncMessage, Config, NoTls};

use crate::wake::Wakeup;

/// The channel the store's SQL notifies.
pub(crate) const CHANNEL: &str = "poimen_work";

/// How long the listener waits before connecting again.
const RECONNECT: Duration = Duration::from_secs(1);

/// Listens until the task is aborted (when the store is dropped).
pub(crate) async fn listen(config: Config, wake: Arc<Wakeup>, url: String) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut conn)) => {
                let sql = format!("LISTEN {CHANNEL}");
                let listen = client.batch_execute(&sql);
                tokio::pin!(listen);
                let mut listening = false;
                loop {
                    tokio::select! {
                        r = &mut listen, if !listening => match r {
                            Ok(()) => {
                                listening = true;
                                // Work may have been queued while no one listened.
                                wake.ring();
                            }
                            Err(e) => {
                                tracing::warn!(store = %url, "LISTEN {CHANNEL} failed: {e}");
                                break;
                            }
                        },
                        m = std::future::poll_fn(|cx| conn.poll_message(cx)) => match m {
                            Some(Ok(AsyncMessage::Notification(_))) => wake.ring(),
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::debug!(store = %url, "the LISTEN connection broke: {e}");
                                break;
                            }
                            None => break,
                        },
                    }
                }
            }
            Err(e) => tracing::debug!(store = %url, "cannot open the LISTEN connection: {e}"),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}
