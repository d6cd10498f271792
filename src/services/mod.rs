//! Services: processors that talk to an engine (STT, LLM, TTS). Every kind has an embedded local
//! engine and network providers behind the same trait.

pub mod llm;
pub mod pricing;
pub mod stt;
pub mod tts;
pub mod ws;

/// OpenAI's API, when `OPENAI_BASE_URL` names no other.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

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
) -> Result<(String, Option<crate::secret::Secret>), String> {
    let api_key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty())
        .map(crate::secret::Secret::new);
    let base_url = url_from_env("OPENAI_BASE_URL").unwrap_or_else(|| OPENAI_BASE_URL.to_owned());
    if api_key.is_none() && base_url == OPENAI_BASE_URL {
        return Err(format!(
            "{flag} needs OPENAI_API_KEY (or OPENAI_BASE_URL for a server that needs no key)"
        ));
    }
    Ok((base_url, api_key))
}
