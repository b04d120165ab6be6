//! HTTPS with rustls (vLLM's `--ssl-certfile` / `--ssl-keyfile`). Handshakes run in tasks of
//! their own and hand finished streams to axum, so a slow or failing client never holds up the
//! connections behind it.

use std::io::BufReader;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A certificate chain and its private key, loaded and checked.
#[derive(Clone)]
pub struct Tls(TlsAcceptor);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// Loads PEM files; an error names the file and what is wrong with it.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Tls, String> {
        let open =
            |path: &Path| std::fs::File::open(path).map(BufReader::new).map_err(|e| format!("{}: {e}", path.display()));
        let certs = rustls_pemfile::certs(&mut open(cert_file)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert_file.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no certificate in it", cert_file.display()));
        }
        let key = rustls_pemfile::private_key(&mut open(key_file)?)
            .map_err(|e| format!("{}: not a PEM private key: {e}", key_file.display()))?
            .ok_or_else(|| format!("{}: no private key in it", key_file.display()))?;
        // ring rather than rustls's default aws-lc-rs: no large C build for a flag few servers
        // use (most terminate TLS in a proxy). rustls marks it deprecated because it offers no
        // post-quantum key exchange.
        #[allow(deprecated)]
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| format!("{} and {}: {e}", cert_file.display(), key_file.display()))?;
        // As uvicorn offers: HTTP/1.1 (the OpenAI clients' protocol).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls(TlsAcceptor::from(Arc::new(config))))
    }

    /// Accepts on `listener` and yields connections once their handshake is done.
    pub(crate) fn listen(&self, listener: TcpListener) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let acceptor = self.0.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, addr) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local })
    }
}

/// Connections whose TLS handshake has completed.
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop only ends with this listener, so this is never reached.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
