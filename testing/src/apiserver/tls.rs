//! TLS for the test API server, so every measurement and end-to-end test pays what a cluster
//! costs (a handshake, certificate verification): a CA and a serving certificate generated at
//! start (ECDSA P-256 through rcgen on ring — ring cannot generate RSA keys), served with
//! tokio-rustls; clients trust the CA through the kubeconfig's `certificate-authority-data`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::{self, pki_types};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::sync::CancellationToken;

use super::TestServerError;

/// A client that connects but never finishes its handshake is dropped after this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The generated CA (its PEM goes into kubeconfigs) and the serving configuration.
#[derive(Clone)]
pub(super) struct TestTls {
    pub ca_pem: String,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TestTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestTls").finish_non_exhaustive()
    }
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> TestServerError {
    TestServerError::Tls(format!("{what}: {e}"))
}

impl TestTls {
    /// A fresh CA and a leaf for `localhost` and 127.0.0.1 signed by it (valid in 2000 only
    /// when `expired`).
    pub fn generate(expired: bool) -> Result<TestTls, TestServerError> {
        let rcgen_error = |what| move |e: rcgen::Error| tls_error(what, e);
        let ca_key = KeyPair::generate().map_err(rcgen_error("CA key"))?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error("CA"))?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "istio-cni test API server CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(rcgen_error("CA cert"))?;
        let issuer = Issuer::new(ca, ca_key);

        let leaf_key = KeyPair::generate().map_err(rcgen_error("serving key"))?;
        let mut leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .map_err(rcgen_error("serving cert"))?;
        leaf.distinguished_name
            .push(DnType::CommonName, "istio-cni test API server");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            leaf.not_before = rcgen::date_time_ymd(2000, 1, 1);
            leaf.not_after = rcgen::date_time_ymd(2000, 12, 31);
        }
        let leaf_cert = leaf
            .signed_by(&leaf_key, &issuer)
            .map_err(rcgen_error("serving cert"))?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("TLS versions", e))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf_cert.der().clone(), ca_cert.der().clone()], key)
            .map_err(|e| tls_error("serving config", e))?;
        Ok(TestTls {
            ca_pem: ca_cert.pem(),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Wraps a bound TCP listener: connections are accepted and their handshakes run beside
    /// the accept loop (a stalled client holds nobody up), until `cancel`.
    pub fn listener(&self, tcp: TcpListener, cancel: CancellationToken) -> TlsListener {
        let addr = tcp.local_addr().ok();
        let (tx, rx) = mpsc::channel(64);
        let acceptor = self.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = cancel.cancelled() => return,
                    accepted = tcp.accept() => accepted,
                };
                let Ok((stream, peer)) = accepted else {
                    // Out of fds and the like: back off briefly, as axum's own loop does.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    if let Ok(Ok(tls)) =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        let _ = tx.send((tls, peer)).await;
                    }
                });
            }
        });
        TlsListener { rx, addr }
    }
}

/// Accepted and handshaken connections, for `axum::serve`.
pub(super) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: Option<SocketAddr>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(accepted) => accepted,
            // The accept loop stopped (this generation is shutting down): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.addr
            .ok_or_else(|| std::io::Error::other("listener address unknown"))
    }
}
