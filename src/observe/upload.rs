//! Finished recordings to S3-compatible storage (`--record-url s3://bucket/prefix`): one
//! signed `PUT` per file (AWS Signature Version 4), after the session has ended, so a slow or
//! failing bucket costs an upload, counted, never a call.
//!
//! The signing is sans-IO ([`S3Target::sign`]); [`S3Target::put`] drives it with reqwest.
//! Credentials, the region and a compatible store's endpoint come from the standard AWS
//! variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`
//! (or `AWS_DEFAULT_REGION`; default `us-east-1`), `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`
//! (a MinIO, R2 or Ceph endpoint: then path-style URLs).

use std::path::Path;
use std::time::Duration;

use ring::{digest, hmac};

use crate::bot::tools::civil_from_days;
use crate::secret::Secret;

/// How long one upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest file uploaded in one `PUT` (S3's limit is 5 GB; a day's call is far less).
const MAX_UPLOAD: u64 = 4 << 30;

/// Where recordings go and the keys that sign for it.
#[derive(Debug, Clone)]
pub struct S3Target {
    /// `https://s3.eu-west-3.amazonaws.com` or a compatible store's endpoint, no trailing `/`.
    endpoint: String,
    /// Path-style (`endpoint/bucket/key`) rather than virtual-hosted (`bucket.endpoint/key`).
    path_style: bool,
    bucket: String,
    /// The keys' prefix, empty or ending in `/`.
    prefix: String,
    region: String,
    access_key: String,
    secret_key: Secret,
    session_token: Option<Secret>,
}

/// Why `--record-url` cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--record-url: {0}")]
pub struct S3ConfigError(String);

impl S3Target {
    /// The target `s3://bucket/prefix`, with what `lookup` reads of the AWS variables.
    pub fn resolve(
        url: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, S3ConfigError> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| S3ConfigError(format!("{url:?} is not an s3://bucket/prefix URL")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !bucket_ok {
            return Err(S3ConfigError(format!("{bucket:?} is not a bucket name")));
        }
        let prefix_ok = prefix.len() <= 512
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        if !prefix_ok {
            return Err(S3ConfigError(format!(
                "the prefix {prefix:?} may hold letters, digits, '-', '_', '.' and '/' only"
            )));
        }
        let prefix = match prefix.trim_matches('/') {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let (endpoint, path_style) =
            match var("AWS_ENDPOINT_URL_S3").or_else(|| var("AWS_ENDPOINT_URL")) {
                Some(endpoint) => (endpoint.trim_end_matches('/').to_owned(), true),
                None => (format!("https://s3.{region}.amazonaws.com"), false),
            };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(S3ConfigError(format!(
                "the endpoint {endpoint:?} is not an http:// or https:// URL"
            )));
        }
        let access_key = var("AWS_ACCESS_KEY_ID")
            .ok_or_else(|| S3ConfigError("AWS_ACCESS_KEY_ID is not set".into()))?;
        let secret_key = var("AWS_SECRET_ACCESS_KEY")
            .ok_or_else(|| S3ConfigError("AWS_SECRET_ACCESS_KEY is not set".into()))?;
        Ok(Self {
            endpoint,
            path_style,
            bucket: bucket.to_owned(),
            prefix,
            region,
            access_key,
            secret_key: Secret::new(secret_key),
            session_token: var("AWS_SESSION_TOKEN").map(Secret::new),
        })
    }

    /// Where the file `name` goes: the URL, its host, and its path.
    fn locate(&self, name: &str) -> (String, String, String) {
        let key = format!("{}{name}", self.prefix);
        let (scheme, host) = self
            .endpoint
            .split_once("://")
            .unwrap_or(("https", &self.endpoint));
        let (host, path) = if self.path_style {
            (host.to_owned(), format!("/{}/{key}", self.bucket))
        } else {
            (format!("{}.{host}", self.bucket), format!("/{key}"))
        };
        (format!("{scheme}://{host}{path}"), host, path)
    }

    /// The headers that sign a `PUT` of a body whose SHA-256 is `payload_sha256` (hex) to
    /// `host` and `path`, at `now` (`YYYYMMDDTHHMMSSZ`): AWS Signature Version 4, the S3
    /// flavour (the path is not encoded twice, the payload's hash is a header).
    pub fn sign(
        &self,
        (host, path): (&str, &str),
        content_type: &str,
        payload_sha256: &str,
        now: &str,
    ) -> Vec<(String, String)> {
        let date = &now[..8];
        let mut headers = vec![
            ("content-type".to_owned(), content_type.to_owned()),
            ("host".to_owned(), host.to_owned()),
            ("x-amz-content-sha256".to_owned(), payload_sha256.to_owned()),
            ("x-amz-date".to_owned(), now.to_owned()),
        ];
        if let Some(token) = &self.session_token {
            headers.push(("x-amz-security-token".to_owned(), token.expose().to_owned()));
        }
        let signed = headers
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let canonical = format!(
            "PUT\n{}\n\n{}\n{signed}\n{payload_sha256}",
            uri_encode_path(path),
            headers
                .iter()
                .map(|(name, value)| format!("{name}:{}\n", value.trim()))
                .collect::<String>()
        );
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{now}\n{scope}\n{}",
            hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
        );
        let mut key = format!("AWS4{}", self.secret_key.expose()).into_bytes();
        for part in [date, &self.region, "s3", "aws4_request"] {
            key = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &key), part.as_bytes())
                .as_ref()
                .to_vec();
        }
        let signature = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &key), to_sign.as_bytes());
        headers.push((
            "authorization".to_owned(),
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={}",
                self.access_key,
                hex(signature.as_ref())
            ),
        ));
        headers
    }

    /// Uploads the file at `path` as `name` under the prefix; the object's URL.
    pub async fn put(
        &self,
        client: &reqwest::Client,
        path: &Path,
        name: &str,
        content_type: &str,
    ) -> Result<String, String> {
        let file = path.to_owned();
        let (body, sha256) = tokio::task::spawn_blocking(move || read_and_hash(&file))
            .await
            .map_err(|e| e.to_string())??;
        let (url, host, key_path) = self.locate(name);
        let mut request = client.put(&url).timeout(UPLOAD_TIMEOUT).body(body);
        for (name, value) in self.sign((&host, &key_path), content_type, &sha256, &amz_now()) {
            if name != "host" {
                request = request.header(name, value);
            }
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => Ok(url),
            Ok(response) => Err(format!("{url}: the store answered {}", response.status())),
            Err(e) => Err(format!("{url}: {e}")),
        }
    }
}

fn read_and_hash(path: &Path) -> Result<(Vec<u8>, String), String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .len();
    if size > MAX_UPLOAD {
        return Err(format!(
            "{} is {size} bytes: too large to upload",
            path.display()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let sha256 = hex(digest::digest(&digest::SHA256, &bytes).as_ref());
    Ok((bytes, sha256))
}

/// Now as SigV4 writes it.
fn amz_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// A path as SigV4 wants it: every byte but unreserved ones and `/` percent-encoded.
fn uri_encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn local() -> S3Target {
        S3Target::resolve(
            "s3://voxide-test/calls",
            env(&[
                ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
                (
                    "AWS_SECRET_ACCESS_KEY",
                    "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                ),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9050/"),
            ]),
        )
        .expect("a target")
    }

    #[test]
    fn a_put_is_signed_as_botocore_signs_it() {
        // botocore's S3SigV4Auth on the same request, the same keys and the same moment.
        let target = local();
        let (url, host, path) = target.locate("ws-1.wav");
        assert_eq!(url, "http://127.0.0.1:9050/voxide-test/calls/ws-1.wav");
        let body_sha256 = hex(digest::digest(&digest::SHA256, b"RIFF-test-body").as_ref());
        assert_eq!(
            body_sha256,
            "b9289e5481682e3fd968c56133e4f9ad144654fda1e4153bb49ddcfbc7399065"
        );
        let headers = target.sign(
            (&host, &path),
            "audio/wav",
            &body_sha256,
            "20261127T134956Z",
        );
        let authorization = &headers.last().expect("signed").1;
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261127/us-east-1/s3/aws4_request, \
             SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date, \
             Signature=987cf8de5a97d3fcf042d9f8c53d0491fa4dbffbbaea31bf2c3758975e0e49f9"
        );
    }

    #[test]
    fn amazons_own_endpoint_is_virtual_hosted_in_the_region() {
        let target = S3Target::resolve(
            "s3://calls-archive",
            env(&[
                ("AWS_ACCESS_KEY_ID", "a"),
                ("AWS_SECRET_ACCESS_KEY", "b"),
                ("AWS_REGION", "eu-west-3"),
            ]),
        )
        .expect("a target");
        assert_eq!(
            target.locate("ws-1.json").0,
            "https://calls-archive.s3.eu-west-3.amazonaws.com/ws-1.json"
        );
    }

    #[test]
    fn a_bad_url_a_bad_bucket_and_missing_keys_are_said_at_start() {
        let keys = [("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b")];
        for (url, says) in [
            ("https://bucket/x", "not an s3://"),
            ("s3://Bad_Bucket/x", "not a bucket name"),
            ("s3://bucket/a b", "the prefix"),
        ] {
            let e = S3Target::resolve(url, env(&keys))
                .expect_err(url)
                .to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        let e = S3Target::resolve("s3://bucket", env(&[])).expect_err("no keys");
        assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"));
    }
}
