//! The control plane's keys and certificates, generated for each start (ECDSA P-256 through rcgen
//! on ring, which cannot make RSA keys; kube-apiserver takes ECDSA for all of them): a CA, the
//! API server's serving certificate for loopback, an admin client certificate in
//! `system:masters`, and the service-account token signing key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::ControlPlaneError;

/// The files kube-apiserver is pointed at, and the PEMs clients need.
pub(super) struct Pki {
    pub ca_pem: String,
    pub ca_file: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// The token signing key, and its public half (what verifies the tokens).
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
}

fn pki_error(what: &'static str) -> impl Fn(rcgen::Error) -> ControlPlaneError {
    move |e| ControlPlaneError::Pki(format!("{what}: {e}"))
}

impl Pki {
    /// Generates everything and writes the server's files into `dir`.
    pub fn generate(dir: &Path) -> Result<Pki, ControlPlaneError> {
        let ca_key = KeyPair::generate().map_err(pki_error("CA key"))?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(pki_error("CA"))?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "istio-cni test control plane CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(pki_error("CA cert"))?;
        let issuer = Issuer::new(ca, ca_key);

        // The names a client on this machine or a pod would use for the API server.
        let names = [
            "localhost",
            "127.0.0.1",
            "10.96.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ];
        let serving_key = KeyPair::generate().map_err(pki_error("serving key"))?;
        let mut serving = CertificateParams::new(names.map(String::from).to_vec())
            .map_err(pki_error("serving cert"))?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving
            .signed_by(&serving_key, &issuer)
            .map_err(pki_error("serving cert"))?;

        let admin_key = KeyPair::generate().map_err(pki_error("admin key"))?;
        let mut admin =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_error("admin cert"))?;
        admin
            .distinguished_name
            .push(DnType::CommonName, "istio-cni-test-admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin
            .signed_by(&admin_key, &issuer)
            .map_err(pki_error("admin cert"))?;

        let sa_key = KeyPair::generate().map_err(pki_error("service-account key"))?;

        let pki = Pki {
            ca_pem: ca_cert.pem(),
            ca_file: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            service_account_key: dir.join("sa.key"),
            service_account_public_key: dir.join("sa.pub"),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
        };
        for (path, text) in [
            (&pki.ca_file, pki.ca_pem.clone()),
            (&pki.serving_cert, serving_cert.pem()),
            (&pki.serving_key, serving_key.serialize_pem()),
            (&pki.service_account_key, sa_key.serialize_pem()),
            (&pki.service_account_public_key, sa_key.public_key_pem()),
        ] {
            std::fs::write(path, text).map_err(|source| ControlPlaneError::Write {
                path: path.clone(),
                source,
            })?;
        }
        Ok(pki)
    }
}
