//! Hook modules as OCI artifacts, and their signatures in cosign's format.
//!
//! A module is an OCI image manifest with a config of media type `application/vnd.wasm.config.v0+json` and one
//! layer of media type `application/wasm` (the layout of the CNCF wasm working group; the older
//! `application/vnd.wasm.content.layer.v1+wasm` layer is read too). It is pulled by the digest of its manifest
//! only: the manifest's bytes must hash to that digest and the layer's bytes to the layer's digest.
//!
//! A signature is what `cosign sign --key` stores: a manifest tagged `sha256-<hex>.sig` in the module's
//! repository whose layers are "simple signing" payloads (`application/vnd.dev.cosign.simplesigning.v1+json`),
//! each with its ECDSA P-256 / SHA-256 signature (ASN.1 DER, base64) in the annotation
//! `dev.cosignproject.cosign/signature`. Verification is offline: the payload's bytes must match its layer
//! digest, the signature over those bytes must verify with one of the operator's public keys, the payload's
//! `critical.type` must be `cosign container image signature` and its `critical.image.docker-manifest-digest`
//! must be the module's manifest digest. Nothing else is checked: no transparency log, no certificate, no
//! `critical.identity.docker-reference` (a module mirrored to another registry keeps its signature).
//!
//! Every registry operation is bounded in time; manifests, payloads and modules in bytes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePublicKey as _};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::hook_state::Reason;

/// The layer media type of a wasm module.
pub const WASM_LAYER: &str = "application/wasm";
/// The layer media type older wasm artifacts use (still accepted when pulling).
pub const WASM_LAYER_LEGACY: &str = "application/vnd.wasm.content.layer.v1+wasm";
/// The config media type of a wasm module.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// A cosign "simple signing" payload.
pub const SIMPLESIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Where cosign puts a payload's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const COSIGN_TYPE: &str = "cosign container image signature";

/// The largest module pulled.
pub const MAX_MODULE_BYTES: u64 = 64 << 20;
const MAX_MANIFEST_BYTES: usize = 1 << 20;
const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
/// Signature layers looked at, at most.
const MAX_SIGNATURES: usize = 32;

/// What went wrong pulling, verifying or pushing; [`DistError::reason`] is the short word reported in a hook
/// resource's status.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("{0}")]
    Reference(String),
    #[error("{reference}: registry: {reason}")]
    Registry { reference: String, reason: String },
    #[error("{reference}: no answer from the registry within {secs} s")]
    Timeout { reference: String, secs: u64 },
    #[error("{reference}: {reason}")]
    NotFound { reference: String, reason: String },
    /// The bytes served are not those the digest names: tampering (or a broken registry), never an outage.
    #[error("{reference}: {what} does not match its digest: expected {expected}, got {actual}")]
    Digest {
        reference: String,
        what: String,
        expected: String,
        actual: String,
    },
    /// The registry wants credentials Plexus does not have (it pulls anonymously).
    #[error("{reference}: the registry refused access: {reason}")]
    Unauthorized { reference: String, reason: String },
    #[error("{reference}: {reason}")]
    Content { reference: String, reason: String },
    #[error("{reference}: no signature (looked for {tag})")]
    SignatureMissing { reference: String, tag: String },
    #[error("{reference}: {reason}")]
    SignatureInvalid { reference: String, reason: String },
    #[error("{0}")]
    Key(String),
}

impl DistError {
    /// The reason of the hook's status on the node.
    pub fn reason(&self) -> Reason {
        match self {
            DistError::Reference(_) => Reason::InvalidReference,
            DistError::Registry { .. } | DistError::Timeout { .. } => Reason::PullFailed,
            DistError::NotFound { .. } => Reason::NotFound,
            DistError::Digest { .. } => Reason::DigestMismatch,
            DistError::Unauthorized { .. } => Reason::Unauthorized,
            DistError::Content { .. } => Reason::NotAWasmModule,
            DistError::SignatureMissing { .. } => Reason::SignatureMissing,
            DistError::SignatureInvalid { .. } => Reason::SignatureInvalid,
            DistError::Key(_) => Reason::NoTrustedKeys,
        }
    }
}

/// How to reach registries.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Registries (`host` or `host:port`) spoken to over plain HTTP.
    pub insecure: Vec<String>,
    /// PEM files of CAs trusted besides the system's.
    pub ca_files: Vec<PathBuf>,
    /// Bound of each registry operation.
    pub timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure: Vec::new(),
            ca_files: Vec::new(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The grammar of a reference, as the distribution project writes it: `[REGISTRY[:PORT]/]PATH[:TAG][@DIGEST]`.
/// Its character classes are ASCII, as Go's regexp reads them. The OCI crate's own parser builds the same grammar
/// with Unicode classes: a matcher of about 15 MB that stays for the life of the process, in a daemon that parses
/// one reference. Built this way it is tens of kilobytes.
const REFERENCE_GRAMMAR: &str = concat!(
    // The registry: dot-separated labels and a port, then a slash.
    r"^((?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)?",
    // The path: components of lower-case alphanumerics joined by `.`, `_`, `__` or dashes, separated by slashes.
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)",
    r"(?::([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?",
    r"(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}))?$",
);

/// Parses an OCI reference: what the OCI crate's parser returns for it, Docker Hub's defaults included.
pub fn parse_reference(text: &str) -> Result<Reference, DistError> {
    static GRAMMAR: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let bad = |why: &str| DistError::Reference(format!("{text:?} is not an OCI reference: {why}"));
    let grammar = GRAMMAR.get_or_init(|| {
        regex::RegexBuilder::new(REFERENCE_GRAMMAR)
            .unicode(false)
            .build()
            .expect("the reference grammar compiles")
    });
    let caps = grammar
        .captures(text)
        .ok_or_else(|| bad("expected [REGISTRY/]REPOSITORY[:TAG][@DIGEST]"))?;
    let (registry, repository) = split_registry(&caps[1]);
    if repository.len() > 255 {
        return Err(bad("its repository name is longer than 255 characters"));
    }
    let tag = caps.get(2).map(|m| m.as_str().to_string());
    let Some(digest) = caps.get(3).map(|m| m.as_str().to_string()) else {
        let tag = tag.unwrap_or_else(|| "latest".to_string());
        return Ok(Reference::with_tag(registry, repository, tag));
    };
    let (hex, wanted) = match digest.split_once(':') {
        Some(("sha256", hex)) => (hex.len(), 64),
        Some(("sha384", hex)) => (hex.len(), 96),
        Some(("sha512", hex)) => (hex.len(), 128),
        _ => {
            return Err(bad(
                "its digest's algorithm is not sha256, sha384 or sha512",
            ))
        }
    };
    if hex != wanted {
        return Err(bad("its digest has the wrong length for its algorithm"));
    }
    Ok(match tag {
        Some(tag) => Reference::with_tag_and_digest(registry, repository, tag, digest),
        None => Reference::with_digest(registry, repository, digest),
    })
}

/// A reference's name split into registry and repository, with Docker Hub's defaults: a first component is a
/// registry only if it has a dot or a port or is `localhost`; Docker Hub's single-component names are `library/`'s.
fn split_registry(name: &str) -> (String, String) {
    const HUB: &str = "docker.io";
    let (registry, repository) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first, rest),
        _ => (HUB, name),
    };
    let registry = if registry == "index.docker.io" {
        HUB
    } else {
        registry
    };
    let repository = if registry == HUB && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository.to_string()
    };
    (registry.to_string(), repository)
}

/// Parses a reference that must be pinned by a sha256 digest.
pub fn pinned_reference(text: &str) -> Result<Reference, DistError> {
    let r = parse_reference(text)?;
    match r.digest() {
        Some(d) if is_sha256_digest(d) => Ok(r),
        _ => Err(DistError::Reference(format!(
            "{text:?} is not pinned by digest (expected REGISTRY/REPOSITORY@sha256:<64 hex>)"
        ))),
    }
}

fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The tag cosign stores a manifest's signatures under.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replace(':', "-"))
}

/// The operator's public keys (PEM, SubjectPublicKeyInfo, ECDSA P-256 — what `cosign generate-key-pair` writes
/// as `cosign.pub`).
#[derive(Debug, Clone, Default)]
pub struct TrustedKeys {
    keys: Vec<(String, VerifyingKey)>,
}

impl TrustedKeys {
    /// Reads each file (at most 64 KiB; one PEM public key each). A directory stands for its `*.pub` and `*.pem`
    /// files (a ConfigMap mounted whole: one key per entry, so a key is added or removed by editing the
    /// ConfigMap); at most [`MAX_KEYS`] keys in all. Any file that is not a key makes the whole set unusable:
    /// trust is not guessed.
    pub fn load(paths: &[PathBuf]) -> Result<TrustedKeys, DistError> {
        let mut files = Vec::new();
        for p in paths {
            if p.is_dir() {
                let entries = std::fs::read_dir(p)
                    .map_err(|e| DistError::Key(format!("{}: {e}", p.display())))?;
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| {
                        f.extension().is_some_and(|x| x == "pub" || x == "pem")
                            && !f
                                .file_name()
                                .is_some_and(|n| n.to_string_lossy().starts_with(".."))
                            && f.is_file()
                    })
                    .collect();
                found.sort();
                files.extend(found);
            } else {
                files.push(p.clone());
            }
            if files.len() > MAX_KEYS {
                return Err(DistError::Key(format!("more than {MAX_KEYS} key files")));
            }
        }
        let mut keys = Vec::new();
        for p in &files {
            let pem = read_small(p, 64 << 10).map_err(DistError::Key)?;
            let key = VerifyingKey::from_public_key_pem(&pem).map_err(|e| {
                DistError::Key(format!(
                    "{}: not a PEM ECDSA P-256 public key: {e}",
                    p.display()
                ))
            })?;
            keys.push((key_id(&key), key));
        }
        Ok(TrustedKeys { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The IDs of the keys (first 16 hex of the sha256 of the DER public key).
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|(id, _)| id.clone()).collect()
    }

    fn verify(&self, payload: &[u8], signature: &Signature) -> Option<&str> {
        self.keys
            .iter()
            .find(|(_, k)| k.verify(payload, signature).is_ok())
            .map(|(id, _)| id.as_str())
    }
}

/// The most trusted keys read.
pub const MAX_KEYS: usize = 64;

/// A key's ID: the first 16 hex digits of the sha256 of its DER SubjectPublicKeyInfo.
pub fn key_id(key: &VerifyingKey) -> String {
    let der = key
        .to_public_key_der()
        .map(|d| d.as_bytes().to_vec())
        .unwrap_or_default();
    hex::encode(Sha256::digest(der))[..16].to_string()
}

/// Reads a PKCS#8 PEM ECDSA P-256 private key (e.g. `openssl genpkey -algorithm EC -pkeyopt
/// ec_paramgen_curve:P-256`).
pub fn load_signing_key(path: &Path) -> Result<SigningKey, DistError> {
    let pem = read_small(path, 64 << 10).map_err(DistError::Key)?;
    SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
        DistError::Key(format!(
            "{}: not an unencrypted PKCS#8 PEM ECDSA P-256 private key: {e}",
            path.display()
        ))
    })
}

/// A small text file (keys, CA certificates), at most `max` bytes.
fn read_small(path: &Path, max: usize) -> Result<String, String> {
    let bytes =
        plexus_cni::conf::read_capped(path, max).map_err(|e| format!("{}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A module pulled and checked against its digests.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The manifest's digest (`sha256:...`), the one the reference pins.
    pub manifest_digest: String,
    /// The component's sha256 (hex), the layer's digest.
    pub sha256: String,
    pub wasm: Vec<u8>,
}

/// The parts of an image manifest read here.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    layers: Vec<OciDescriptor>,
}

/// A registry client with the operator's settings.
pub struct Registry {
    client: Client,
    timeout: Duration,
}

impl Registry {
    pub fn new(opts: &RegistryOptions) -> Result<Registry, DistError> {
        // reqwest is built without a TLS provider of its own; the process uses ring's (as kube does). Installing
        // it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut certs = Vec::new();
        for p in &opts.ca_files {
            let pem = read_small(p, 1 << 20).map_err(DistError::Key)?;
            certs.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.into_bytes(),
            });
        }
        let config = ClientConfig {
            protocol: if opts.insecure.is_empty() {
                ClientProtocol::Https
            } else {
                ClientProtocol::HttpsExcept(opts.insecure.clone())
            },
            extra_root_certificates: certs,
            read_timeout: Some(opts.timeout),
            connect_timeout: Some(opts.timeout.min(Duration::from_secs(10))),
            user_agent: concat!("plexus/", env!("CARGO_PKG_VERSION")),
            platform_resolver: None,
            ..ClientConfig::default()
        };
        let client = Client::try_from(config).map_err(|e| DistError::Registry {
            reference: "(client)".into(),
            reason: e.to_string(),
        })?;
        Ok(Registry {
            client,
            timeout: opts.timeout,
        })
    }

    async fn bounded<T>(
        &self,
        reference: &Reference,
        f: impl std::future::Future<Output = Result<T, DistError>>,
    ) -> Result<T, DistError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .unwrap_or_else(|_| {
                Err(DistError::Timeout {
                    reference: reference.whole(),
                    secs: self.timeout.as_secs(),
                })
            })
    }

    async fn auth(&self, reference: &Reference) {
        self.client
            .store_auth_if_needed(reference.resolve_registry(), &RegistryAuth::Anonymous)
            .await;
    }

    /// The manifest at `reference`, checked against `digest` when given; `None` when the registry has none.
    async fn manifest(
        &self,
        reference: &Reference,
        digest: Option<&str>,
    ) -> Result<Option<(Vec<u8>, Manifest)>, DistError> {
        self.auth(reference).await;
        let got = self
            .client
            .pull_manifest_raw(
                reference,
                &RegistryAuth::Anonymous,
                &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
            )
            .await;
        let bytes = match got {
            Ok((bytes, _)) => bytes,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(registry_err(reference, &e)),
        };
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(DistError::Content {
                reference: reference.whole(),
                reason: format!("manifest larger than {MAX_MANIFEST_BYTES} bytes"),
            });
        }
        if let Some(want) = digest {
            let got = sha256_digest(&bytes);
            if got != want {
                return Err(DistError::Digest {
                    reference: reference.whole(),
                    what: "the manifest".into(),
                    expected: want.to_string(),
                    actual: got,
                });
            }
        }
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| DistError::Content {
            reference: reference.whole(),
            reason: format!("not an image manifest: {e}"),
        })?;
        Ok(Some((bytes.to_vec(), m)))
    }

    /// A blob, at most `max` bytes, checked against its digest.
    async fn blob(
        &self,
        reference: &Reference,
        desc: &OciDescriptor,
        max: u64,
    ) -> Result<Vec<u8>, DistError> {
        let too_big = || DistError::Content {
            reference: reference.whole(),
            reason: format!("blob {} is larger than {max} bytes", desc.digest),
        };
        if desc.size < 0 || desc.size as u64 > max {
            return Err(too_big());
        }
        if !is_sha256_digest(&desc.digest) {
            return Err(DistError::Content {
                reference: reference.whole(),
                reason: format!("blob digest {:?} is not sha256", desc.digest),
            });
        }
        let mut stream = self
            .client
            .pull_blob_stream(reference, desc)
            .await
            .map_err(|e| registry_err(reference, &e))?;
        let mut out = Vec::with_capacity(desc.size as usize);
        while let Some(chunk) = stream.stream.next().await {
            // The client checks the digest as the stream ends and reports a mismatch as an I/O error.
            let chunk = chunk.map_err(|e| {
                match e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<oci_client::errors::DigestError>())
                {
                    Some(d) => digest_err(reference, &format!("blob {}", desc.digest), d),
                    None => DistError::Registry {
                        reference: reference.whole(),
                        reason: e.to_string(),
                    },
                }
            })?;
            if (out.len() + chunk.len()) as u64 > max {
                return Err(too_big());
            }
            out.extend_from_slice(&chunk);
        }
        let got = sha256_digest(&out);
        if got != desc.digest {
            return Err(DistError::Digest {
                reference: reference.whole(),
                what: format!("blob {}", desc.digest),
                expected: desc.digest.clone(),
                actual: got,
            });
        }
        Ok(out)
    }

    /// The digest of the manifest a reference (a tag) names now.
    pub async fn resolve(&self, reference: &Reference) -> Result<String, DistError> {
        self.bounded(reference, async {
            match self.manifest(reference, None).await? {
                Some((bytes, _)) => Ok(sha256_digest(&bytes)),
                None => Err(DistError::NotFound {
                    reference: reference.whole(),
                    reason: "the registry has no such manifest".into(),
                }),
            }
        })
        .await
    }

    /// Pulls the module a pinned reference names.
    pub async fn pull_module(&self, reference: &Reference) -> Result<Pulled, DistError> {
        self.bounded(reference, self.pull_module_inner(reference))
            .await
    }

    async fn pull_module_inner(&self, reference: &Reference) -> Result<Pulled, DistError> {
        let digest = reference.digest().ok_or_else(|| {
            DistError::Reference(format!("{} is not pinned by digest", reference.whole()))
        })?;
        let (_, m) = self
            .manifest(reference, Some(digest))
            .await?
            .ok_or_else(|| DistError::NotFound {
                reference: reference.whole(),
                reason: "the registry has no manifest with this digest".into(),
            })?;
        let layers: Vec<&OciDescriptor> = m
            .layers
            .iter()
            .filter(|l| l.media_type == WASM_LAYER || l.media_type == WASM_LAYER_LEGACY)
            .collect();
        let [layer] = layers[..] else {
            return Err(DistError::Content {
                reference: reference.whole(),
                reason: format!(
                    "expected exactly one layer of media type {WASM_LAYER}, found {} (layers: {})",
                    layers.len(),
                    m.layers
                        .iter()
                        .map(|l| l.media_type.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        };
        let wasm = self.blob(reference, layer, MAX_MODULE_BYTES).await?;
        Ok(Pulled {
            manifest_digest: digest.to_string(),
            sha256: layer.digest.trim_start_matches("sha256:").to_string(),
            wasm,
        })
    }

    /// Checks that a signature of the manifest `digest` in the reference's repository verifies with one of
    /// `keys`; answers that key's ID.
    pub async fn verify(
        &self,
        reference: &Reference,
        digest: &str,
        keys: &TrustedKeys,
    ) -> Result<String, DistError> {
        self.bounded(reference, self.verify_inner(reference, digest, keys))
            .await
    }

    async fn verify_inner(
        &self,
        reference: &Reference,
        digest: &str,
        keys: &TrustedKeys,
    ) -> Result<String, DistError> {
        if keys.is_empty() {
            return Err(DistError::Key(
                "signatures are required but no public key is configured".into(),
            ));
        }
        let tag = signature_tag(digest);
        let sig_ref = Reference::with_tag(
            reference.registry().to_string(),
            reference.repository().to_string(),
            tag.clone(),
        );
        let Some((_, m)) = self.manifest(&sig_ref, None).await? else {
            return Err(DistError::SignatureMissing {
                reference: reference.whole(),
                tag,
            });
        };
        let mut why = Vec::new();
        for layer in m
            .layers
            .iter()
            .filter(|l| l.media_type == SIMPLESIGNING)
            .take(MAX_SIGNATURES)
        {
            let Some(sig_b64) = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            else {
                why.push(format!("{}: no {SIGNATURE_ANNOTATION}", layer.digest));
                continue;
            };
            let payload = self.blob(&sig_ref, layer, MAX_PAYLOAD_BYTES).await?;
            match check_signature(&payload, sig_b64, digest, keys) {
                Ok(id) => return Ok(id),
                Err(e) => why.push(format!("{}: {e}", layer.digest)),
            }
        }
        if why.is_empty() {
            return Err(DistError::SignatureMissing {
                reference: reference.whole(),
                tag,
            });
        }
        Err(DistError::SignatureInvalid {
            reference: reference.whole(),
            reason: format!("no signature verifies: {}", why.join("; ")),
        })
    }

    /// Pushes a component as a wasm artifact to `reference` (a tag or a digest); answers the manifest digest.
    pub async fn push_module(
        &self,
        reference: &Reference,
        wasm: Vec<u8>,
    ) -> Result<String, DistError> {
        self.bounded(reference, async {
            self.auth(reference).await;
            let config = br#"{}"#.to_vec();
            let layer_digest = sha256_digest(&wasm);
            let config_digest = sha256_digest(&config);
            let manifest = json!({
                "schemaVersion": 2,
                "mediaType": OCI_IMAGE_MEDIA_TYPE,
                "artifactType": WASM_LAYER,
                "config": {"mediaType": WASM_CONFIG, "digest": config_digest, "size": config.len()},
                "layers": [{"mediaType": WASM_LAYER, "digest": layer_digest, "size": wasm.len()}],
            });
            self.put_blob(reference, config, &config_digest).await?;
            self.put_blob(reference, wasm, &layer_digest).await?;
            self.put_manifest(reference, &manifest).await
        })
        .await
    }

    /// Signs the manifest `digest` of the reference's repository and adds the signature next to those already
    /// there (cosign's layout).
    pub async fn push_signature(
        &self,
        reference: &Reference,
        digest: &str,
        key: &SigningKey,
    ) -> Result<(), DistError> {
        self.bounded(reference, async {
            let sig_ref = Reference::with_tag(
                reference.registry().to_string(),
                reference.repository().to_string(),
                signature_tag(digest),
            );
            let payload = simple_signing_payload(reference, digest);
            let signature: DerSignature = key.sign(&payload);
            let sig_b64 = base64::engine::general_purpose::STANDARD.encode(signature.as_bytes());
            let payload_digest = sha256_digest(&payload);
            let mut layers: Vec<Value> = match self.manifest(&sig_ref, None).await? {
                Some((bytes, _)) => serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("layers").cloned())
                    .and_then(|l| serde_json::from_value(l).ok())
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            layers.retain(|l| l["digest"] != payload_digest.as_str());
            layers.push(json!({
                "mediaType": SIMPLESIGNING, "digest": payload_digest, "size": payload.len(),
                "annotations": {SIGNATURE_ANNOTATION: sig_b64},
            }));
            let config = serde_json::to_vec(&json!({
                "architecture": "", "os": "", "config": {},
                "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l["digest"].clone()).collect::<Vec<_>>()},
            }))
            .expect("json");
            let config_digest = sha256_digest(&config);
            let manifest = json!({
                "schemaVersion": 2,
                "mediaType": OCI_IMAGE_MEDIA_TYPE,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
                "layers": layers,
            });
            self.put_blob(&sig_ref, payload, &payload_digest).await?;
            self.put_blob(&sig_ref, config, &config_digest).await?;
            self.put_manifest(&sig_ref, &manifest).await?;
            Ok(())
        })
        .await
    }

    async fn put_blob(
        &self,
        reference: &Reference,
        data: Vec<u8>,
        digest: &str,
    ) -> Result<(), DistError> {
        self.auth(reference).await;
        if let Ok(true) = self.client.blob_exists(reference, digest).await {
            return Ok(());
        }
        self.client
            .push_blob(reference, data, digest)
            .await
            .map(|_| ())
            .map_err(|e| registry_err(reference, &e))
    }

    async fn put_manifest(
        &self,
        reference: &Reference,
        manifest: &Value,
    ) -> Result<String, DistError> {
        let body = serde_json::to_vec(manifest).expect("json");
        let digest = sha256_digest(&body);
        self.client
            .push_manifest_raw(
                reference,
                body,
                http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
            )
            .await
            .map_err(|e| registry_err(reference, &e))?;
        Ok(digest)
    }
}

/// The payload cosign signs for a manifest digest.
pub fn simple_signing_payload(reference: &Reference, digest: &str) -> Vec<u8> {
    let repo = format!("{}/{}", reference.registry(), reference.repository());
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": repo},
            "image": {"docker-manifest-digest": digest},
            "type": COSIGN_TYPE,
        },
        "optional": null,
    }))
    .expect("json")
}

/// Checks one simple-signing payload and its base64 DER signature; answers the verifying key's ID.
pub fn check_signature(
    payload: &[u8],
    sig_b64: &str,
    digest: &str,
    keys: &TrustedKeys,
) -> Result<String, String> {
    let der = base64::engine::general_purpose::STANDARD
        .decode(sig_b64.trim())
        .map_err(|e| format!("signature is not base64: {e}"))?;
    let sig = Signature::from_der(&der).map_err(|e| format!("not an ECDSA signature: {e}"))?;
    let id = keys
        .verify(payload, &sig)
        .ok_or_else(|| "the signature does not verify with any trusted key".to_string())?;
    let v: Value =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    if v["critical"]["type"] != COSIGN_TYPE {
        return Err(format!("payload type is not {COSIGN_TYPE:?}"));
    }
    let signed = &v["critical"]["image"]["docker-manifest-digest"];
    if signed != digest {
        return Err(format!("the signature is for {signed}, not {digest}"));
    }
    Ok(id.to_string())
}

fn is_not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            use oci_client::errors::OciErrorCode as C;
            matches!(
                e.code,
                C::ManifestUnknown | C::NameUnknown | C::NotFound | C::BlobUnknown
            )
        }),
        OciDistributionError::ServerError { code, .. } => *code == 404,
        _ => false,
    }
}

/// A registry client error, by cause: content that does not match its digest, access refused, or the transport
/// and everything else (an outage, retried).
fn registry_err(reference: &Reference, e: &OciDistributionError) -> DistError {
    match e {
        OciDistributionError::DigestError(d) => digest_err(reference, "the content", d),
        OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => DistError::Unauthorized {
            reference: reference.whole(),
            reason: plexus_cluster::error_chain(e),
        },
        _ => DistError::Registry {
            reference: reference.whole(),
            reason: with_plain_http_hint(reference, plexus_cluster::error_chain(e)),
        },
    }
}

/// A TLS handshake answered by a plain-HTTP server fails with a message about the record type (rustls:
/// "received corrupt message of type InvalidContentType"); the reason then says what to do.
fn with_plain_http_hint(reference: &Reference, reason: String) -> String {
    if reason.contains("InvalidContentType") || reason.contains("corrupt message") {
        format!(
            "{reason} (the registry answers plain HTTP, not HTTPS: if that is intended, name it with \
             --insecure-registry {})",
            reference.registry()
        )
    } else {
        reason
    }
}

fn digest_err(reference: &Reference, what: &str, e: &oci_client::errors::DigestError) -> DistError {
    match e {
        oci_client::errors::DigestError::VerificationError { expected, actual } => {
            DistError::Digest {
                reference: reference.whole(),
                what: what.to_string(),
                expected: expected.clone(),
                actual: actual.clone(),
            }
        }
        other => DistError::Content {
            reference: reference.whole(),
            reason: format!("{what}: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_slice(&[seed; 32]).unwrap()
    }

    fn trusted(k: &SigningKey) -> TrustedKeys {
        let v = *k.verifying_key();
        TrustedKeys {
            keys: vec![(key_id(&v), v)],
        }
    }

    const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn signed(k: &SigningKey, digest: &str) -> (Vec<u8>, String) {
        let r = parse_reference("127.0.0.1:5000/vendor/hook:v1").unwrap();
        let payload = simple_signing_payload(&r, digest);
        let sig: DerSignature = k.sign(&payload);
        (
            payload,
            base64::engine::general_purpose::STANDARD.encode(sig.as_bytes()),
        )
    }

    #[test]
    fn a_signature_verifies_only_with_its_key_and_for_its_digest() {
        let (payload, sig) = signed(&key(1), DIGEST);
        assert!(check_signature(&payload, &sig, DIGEST, &trusted(&key(1))).is_ok());
        let other = check_signature(&payload, &sig, DIGEST, &trusted(&key(2))).unwrap_err();
        assert!(other.contains("does not verify"), "{other}");
        let wrong_digest = DIGEST.replace("01", "02");
        let e = check_signature(&payload, &sig, &wrong_digest, &trusted(&key(1))).unwrap_err();
        assert!(e.contains("is for"), "{e}");
        // A payload changed after signing.
        let mut tampered = payload.clone();
        let n = tampered.len();
        tampered[n - 3] ^= 1;
        assert!(check_signature(&tampered, &sig, DIGEST, &trusted(&key(1))).is_err());
        assert!(check_signature(&payload, "%%%", DIGEST, &trusted(&key(1))).is_err());
    }

    #[test]
    fn references_parse_as_the_oci_crate_parses_them() {
        let long = format!("r.io/{}", "a".repeat(256));
        let cases = [
            "127.0.0.1:5000/vendor/hook:v1".to_string(),
            format!("127.0.0.1:5000/vendor/hook@{DIGEST}"),
            format!("registry.example.com/a/b-c/d__e.f:V1.0-rc_1@{DIGEST}"),
            "localhost/hook".to_string(),
            "localhost:5000/x/y:latest".to_string(),
            "busybox".to_string(),
            "index.docker.io/busybox:1".to_string(),
            "vendor/hook:v2".to_string(),
            "[::1]:5000/hook".to_string(),
            "Upper/hook".to_string(),
            "hook:".to_string(),
            "hook@sha256:abc".to_string(),
            format!("hook@sha384:{}", "a".repeat(64)),
            format!("hook@md5:{}", "a".repeat(32)),
            format!("hook:{}", "t".repeat(129)),
            "a//b".to_string(),
            "-a/b".to_string(),
            "not a reference".to_string(),
            String::new(),
            long,
        ];
        for case in &cases {
            let ours = parse_reference(case).ok();
            let theirs = case.parse::<Reference>().ok();
            assert_eq!(ours, theirs, "{case:?}");
        }
        // Tags are ASCII, as the distribution project's grammar (Go's `\w`) has them.
        assert!(parse_reference("r.io/hook:v\u{e9}").is_err());
        let e = parse_reference("not a reference").unwrap_err().to_string();
        assert!(
            e.contains("\"not a reference\" is not an OCI reference"),
            "{e}"
        );
    }

    #[test]
    fn references_must_be_pinned_by_sha256() {
        assert!(pinned_reference(&format!("127.0.0.1:5000/a/b@{DIGEST}")).is_ok());
        for bad in [
            "127.0.0.1:5000/a/b:v1",
            "127.0.0.1:5000/a/b@sha256:abc",
            "not a reference",
        ] {
            assert!(pinned_reference(bad).is_err(), "{bad}");
        }
        assert_eq!(
            signature_tag(DIGEST),
            "sha256-0000000000000000000000000000000000000000000000000000000000000001.sig"
        );
    }

    #[test]
    fn registry_errors_are_told_apart_by_cause() {
        let r = parse_reference("127.0.0.1:5000/vendor/hook:v1").unwrap();
        let reason = |e: OciDistributionError| registry_err(&r, &e).reason();
        assert_eq!(
            reason(OciDistributionError::UnauthorizedError { url: "u".into() }),
            Reason::Unauthorized
        );
        assert_eq!(
            reason(OciDistributionError::ServerError {
                code: 403,
                url: "u".into(),
                message: "denied".into()
            }),
            Reason::Unauthorized
        );
        assert_eq!(
            reason(OciDistributionError::ServerError {
                code: 503,
                url: "u".into(),
                message: "down".into()
            }),
            Reason::PullFailed
        );
        let tampered = registry_err(
            &r,
            &OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError {
                    expected: "sha256:aa".into(),
                    actual: "sha256:bb".into(),
                },
            ),
        );
        assert_eq!(tampered.reason(), Reason::DigestMismatch);
        let text = tampered.to_string();
        assert!(text.contains("expected sha256:aa, got sha256:bb"), "{text}");
    }
}
