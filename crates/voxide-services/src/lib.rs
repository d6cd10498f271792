//! Services: processors that talk to an engine (STT, LLM, TTS). Every kind has an embedded local
//! engine and network providers behind the same trait.

pub mod llm;
pub mod pricing;
pub mod stt;
pub mod tts;
pub mod ws;

/// OpenAI's API, when `OPENAI_BASE_URL` names no other.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// The HTTP client every session's provider requests share: one pool of connections (a
/// provider's TLS connection outlives the session that opened it), and the system's roots read
/// once, not at each session's start. TLS on the process's ring provider.
pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client.clone());
    }
    // A no-op once installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    Ok(CLIENT.get_or_init(|| client).clone())
}

/// A provider's key from `variable`, which `flag` (`--stt deepgram`) needs: a missing one is an
/// error that names both.
pub(crate) fn key_from_env(variable: &str, flag: &str) -> Result<String, String> {
    std::env::var(variable)
        .ok()
        .filter(|k| !k.trim().is_empty())
        .ok_or_else(|| format!("{flag} needs {variable}"))
}

/// A provider's host from `variable` (`DEEPGRAM_URL`), where one is set.
pub(crate) fn url_from_env(variable: &str) -> Option<String> {
    std::env::var(variable)
        .ok()
        .filter(|u| !u.trim().is_empty())
}

/// OpenAI's base URL and key from `OPENAI_BASE_URL` and `OPENAI_API_KEY`, for `flag`: a key is
/// required for OpenAI's own API; a server at another base URL (Ollama, speaches) may need none.
pub(crate) fn openai_from_env(
    flag: &str,
) -> Result<(String, Option<voxide_core::secret::Secret>), String> {
    let api_key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty())
        .map(voxide_core::secret::Secret::new);
    let base_url = url_from_env("OPENAI_BASE_URL").unwrap_or_else(|| OPENAI_BASE_URL.to_owned());
    if api_key.is_none() && base_url == OPENAI_BASE_URL {
        return Err(format!(
            "{flag} needs OPENAI_API_KEY (or OPENAI_BASE_URL for a server that needs no key)"
        ));
    }
    Ok((base_url, api_key))
}

/// Base64 16-bit little-endian PCM back to samples (a trailing odd byte is dropped).
pub fn pcm_from_base64(data: &str) -> Result<Vec<i16>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("audio is not base64: {e}"))?;
    Ok(bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect())
}

/// 16-bit little-endian PCM as base64, as both providers carry audio in JSON.
pub fn pcm_to_base64(samples: &[i16]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
