//! Bounds on connections, against clients that open many and send nothing (slowloris): at most
//! `--max-connections` are served at once (more wait in the kernel's accept backlog), and a
//! connection with no request in flight is closed once it has been idle for the keep-alive
//! time, as uvicorn closes one after `timeout_keep_alive` (5 s in vLLM,
//! `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`). The clock starts when the connection is accepted or its last
//! response ends and is not restarted by the bytes of a request head that is still arriving, so
//! a client trickling its headers is cut too. A request being served (a long prefill, a stream)
//! is never timed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// vLLM's default keep-alive, in seconds.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The connection bounds a server applies.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub keep_alive: Duration,
}

/// A listener that admits at most `max_connections` connections at a time.
pub(crate) struct Bounded<L> {
    inner: L,
    slots: Arc<Semaphore>,
    keep_alive: Duration,
}

impl<L> Bounded<L> {
    pub(crate) fn new(inner: L, limits: ConnectionLimits) -> Bounded<L> {
        Bounded { inner, slots: Arc::new(Semaphore::new(limits.max_connections.max(1))), keep_alive: limits.keep_alive }
    }
}

impl<L: Listener> Listener for Bounded<L> {
    type Io = Guarded<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed.
        let slot = self.slots.clone().acquire_owned().await.expect("connection slots are never closed");
        let (io, addr) = self.inner.accept().await;
        let state = Arc::new(ConnectionState { in_flight: AtomicUsize::new(0), reader: AtomicWaker::new() });
        (Guarded { io, _slot: slot, state, keep_alive: self.keep_alive, idle: None }, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

#[derive(Debug)]
struct ConnectionState {
    /// Requests of this connection whose responses have not ended.
    in_flight: AtomicUsize,
    /// The connection's reader, woken when its last response ends so that the idle clock
    /// starts even if no byte arrives.
    reader: AtomicWaker,
}

/// A connection's handle as requests see it ([`track_requests`] counts them on it).
#[derive(Debug, Clone)]
pub(crate) struct Connection(Arc<ConnectionState>);

impl<L: Listener> axum::extract::connect_info::Connected<IncomingStream<'_, Bounded<L>>> for Connection {
    fn connect_info(stream: IncomingStream<'_, Bounded<L>>) -> Connection {
        Connection(stream.io().state.clone())
    }
}

/// Marks the request's connection busy until its response body has ended or been dropped.
pub(crate) async fn track_requests(request: Request, next: Next) -> Response {
    let Some(ConnectInfo(Connection(state))) = request.extensions().get::<ConnectInfo<Connection>>().cloned() else {
        return next.run(request).await;
    };
    state.in_flight.fetch_add(1, Ordering::AcqRel);
    let busy = Busy(state);
    let response = next.run(request).await;
    response.map(|body| Body::new(BusyBody { body, _busy: busy }))
}

/// A response body that keeps its connection busy until it is dropped; it reports the inner
/// body's size, so a fixed-length response keeps its `Content-Length`.
struct BusyBody {
    body: Body,
    _busy: Busy,
}

impl HttpBody for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

struct Busy(Arc<ConnectionState>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.reader.wake();
        }
    }
}

/// A connection's IO: holds its slot and ends reads (EOF, so the server closes it) once it has
/// been idle, with no request in flight, for the keep-alive time.
pub(crate) struct Guarded<T> {
    io: T,
    _slot: OwnedSemaphorePermit,
    state: Arc<ConnectionState>,
    keep_alive: Duration,
    idle: Option<Pin<Box<Sleep>>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.state.reader.register(cx.waker());
        if this.state.in_flight.load(Ordering::Acquire) > 0 {
            this.idle = None;
        } else {
            let keep_alive = this.keep_alive;
            let idle = this.idle.get_or_insert_with(|| Box::pin(tokio::time::sleep(keep_alive)));
            if idle.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
