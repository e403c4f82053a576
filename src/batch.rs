//! A queue whose items are handled in groups: whatever is queued when a worker is free goes
//! together, so many callers share one database statement or one Redis round trip. Used by
//! group apply (`store/group.rs`) and by the Redis gate (`gate/`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc, oneshot};

/// Counts since start-up, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct GroupStats {
    /// Groups handed to `apply` (for group apply, each one statement or one transaction).
    pub groups: AtomicU64,
    /// Items those groups carried.
    pub items: AtomicU64,
    /// Items a group decided.
    pub decided: AtomicU64,
    /// Groups that failed as a whole (their items were then handled one by one).
    pub failed: AtomicU64,
    /// Items those failed groups carried.
    pub failed_items: AtomicU64,
}

/// A queue whose items are handled in groups: each of `workers` tasks takes whatever is
/// queued, up to `max` (after waiting `linger` from the first item for others; zero: never
/// waiting), hands the group to `apply`, and answers each item with its result.
pub(crate) struct Batcher<I, O> {
    queue: mpsc::Sender<(I, oneshot::Sender<O>)>,
    pub(crate) stats: Arc<GroupStats>,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the workers on `runtime`; they end when the batcher is dropped. `apply` must
    /// answer one result per item, in order; it may count its failures in `stats`.
    pub(crate) fn start<F, Fut>(
        max: usize,
        workers: usize,
        linger: Duration,
        runtime: &tokio::runtime::Handle,
        stats: Arc<GroupStats>,
        apply: F,
    ) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Vec<O>> + Send,
    {
        let (queue, rx) = mpsc::channel(max * 16);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers {
            let (rx, stats, apply) = (rx.clone(), stats.clone(), apply.clone());
            runtime.spawn(async move {
                while let Some(group) = next_group(&rx, max, linger).await {
                    let (items, replies): (Vec<I>, Vec<oneshot::Sender<O>>) =
                        group.into_iter().unzip();
                    stats.groups.fetch_add(1, Ordering::Relaxed);
                    stats.items.fetch_add(items.len() as u64, Ordering::Relaxed);
                    for (reply, result) in replies.into_iter().zip(apply(items).await) {
                        // The caller may have gone (its request was dropped).
                        let _ = reply.send(result);
                    }
                }
            });
        }
        Self { queue, stats }
    }

    /// Queues `item` and waits at most `deadline` for its result. `Err(())` when the deadline
    /// passed (the item may still be handled after); `Ok(None)` when the queue is full or the
    /// workers are gone (the runtime is stopping): the caller does the work itself.
    pub(crate) async fn submit(&self, item: I, deadline: Duration) -> Result<Option<O>, ()> {
        let (reply, result) = oneshot::channel();
        if self.queue.try_send((item, reply)).is_err() {
            return Ok(None);
        }
        match tokio::time::timeout(deadline, result).await {
            Ok(result) => Ok(result.ok()),
            Err(_) => Err(()),
        }
    }

    /// Queues `item` without waiting for its result; the item back when the queue is full
    /// or the workers are gone (the caller does the work itself).
    pub(crate) fn post(&self, item: I) -> Result<(), I> {
        let (reply, _) = oneshot::channel();
        self.queue
            .try_send((item, reply))
            .map_err(|e| e.into_inner().0)
    }
}

/// Whatever is queued, up to `max`, once at least one item is (and `linger` has passed since);
/// `None` once the queue closed.
async fn next_group<T>(
    rx: &Mutex<mpsc::Receiver<T>>,
    max: usize,
    linger: Duration,
) -> Option<Vec<T>> {
    let mut rx = rx.lock().await;
    let first = rx.recv().await?;
    if !linger.is_zero() {
        tokio::time::sleep(linger).await;
    }
    let mut group = Vec::with_capacity(max);
    group.push(first);
    while group.len() < max {
        match rx.try_recv() {
            Ok(item) => group.push(item),
            Err(_) => break,
        }
    }
    Some(group)
}
