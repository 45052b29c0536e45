//! Throwaway x509 material for the TLS tests, made with the openssl crate (no tool needed):
//! a CA, a server certificate for `localhost`/127.0.0.1 and a client certificate signed by
//! it, written in nbdkit's and qemu's layout; and a rogue CA with its own client.

use std::path::{Path, PathBuf};

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509NameBuilder, X509};

pub struct Issued {
    pub cert: X509,
    pub key: PKey<Private>,
}

pub enum Role {
    Ca,
    Server,
    Client,
}

fn new_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

/// A certificate for `cn` in `role`, signed by `issuer` (self-signed when `None`).
pub fn issue(cn: &str, role: Role, issuer: Option<&Issued>) -> Issued {
    let key = new_key();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let mut serial = BigNum::new().unwrap();
    serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap()).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(issuer.map_or(&name, |i| i.cert.subject_name())).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    b.set_not_after(&Asn1Time::days_from_now(30).unwrap()).unwrap();
    match role {
        Role::Ca => {
            b.append_extension(BasicConstraints::new().critical().ca().build().unwrap()).unwrap();
            b.append_extension(KeyUsage::new().critical().key_cert_sign().crl_sign().build().unwrap())
                .unwrap();
        }
        Role::Server | Role::Client => {
            b.append_extension(BasicConstraints::new().critical().build().unwrap()).unwrap();
            b.append_extension(
                KeyUsage::new().critical().digital_signature().key_encipherment().build().unwrap(),
            )
            .unwrap();
            let mut eku = ExtendedKeyUsage::new();
            if matches!(role, Role::Server) {
                eku.server_auth();
            } else {
                eku.client_auth();
            }
            b.append_extension(eku.build().unwrap()).unwrap();
        }
    }
    let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(issuer.map(|i| &*i.cert), None)).unwrap();
    b.append_extension(ski).unwrap();
    if let Some(i) = issuer {
        let aki =
            AuthorityKeyIdentifier::new().keyid(true).build(&b.x509v3_context(Some(&i.cert), None)).unwrap();
        b.append_extension(aki).unwrap();
    }
    if matches!(role, Role::Server) {
        let san = SubjectAlternativeName::new()
            .dns("localhost")
            .ip("127.0.0.1")
            .build(&b.x509v3_context(issuer.map(|i| &*i.cert), None))
            .unwrap();
        b.append_extension(san).unwrap();
    }
    b.sign(issuer.map_or(&key, |i| &i.key), MessageDigest::sha256()).unwrap();
    Issued { cert: b.build(), key }
}

pub fn write(dir: &Path, name: &str, issued: &Issued) {
    std::fs::write(dir.join(format!("{name}-cert.pem")), issued.cert.to_pem().unwrap()).unwrap();
    let key = dir.join(format!("{name}-key.pem"));
    std::fs::write(&key, issued.key.private_key_to_pem_pkcs8().unwrap()).unwrap();
}

/// The directories of one test PKI.
pub struct Pki {
    /// The server's directory: ca-cert.pem, server-cert.pem, server-key.pem.
    pub server: PathBuf,
    /// A good client's directory: ca-cert.pem, client-cert.pem, client-key.pem (libnbd's
    /// and qemu's client layout).
    pub client: PathBuf,
    /// Trusts the CA, presents no certificate.
    pub anonymous: PathBuf,
    /// Trusts the CA, presents a certificate from another CA.
    pub rogue: PathBuf,
    pub ca: Issued,
    pub good_client: Issued,
    pub rogue_client: Issued,
}

pub fn make_pki(root: &Path) -> Pki {
    let ca = issue("sealdisk test CA", Role::Ca, None);
    let server = issue("localhost", Role::Server, Some(&ca));
    let good_client = issue("good client", Role::Client, Some(&ca));
    let other_ca = issue("rogue CA", Role::Ca, None);
    let rogue_client = issue("rogue client", Role::Client, Some(&other_ca));
    let dirs: Vec<PathBuf> =
        ["server", "client", "anonymous", "rogue"].iter().map(|d| root.join(d)).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("ca-cert.pem"), ca.cert.to_pem().unwrap()).unwrap();
    }
    write(&dirs[0], "server", &server);
    write(&dirs[1], "client", &good_client);
    write(&dirs[3], "client", &rogue_client);
    let mut it = dirs.into_iter();
    Pki {
        server: it.next().unwrap(),
        client: it.next().unwrap(),
        anonymous: it.next().unwrap(),
        rogue: it.next().unwrap(),
        ca,
        good_client,
        rogue_client,
    }
}
