//! Twilio's REST API: calls placed, and calls handed over. voxide asks Twilio to dial (`POST
//! /2010-04-01/Accounts/{sid}/Calls.json`) with TwiML that streams the answered call back to
//! `/calls/{id}/stream` in Media Streams' framing; Twilio reports the call's progress to
//! `/calls/{id}/status`, signed with the account's auth token. A call on a Twilio stream
//! (placed or taken) is handed over with new TwiML for it (`Calls/{CallSid}.json`): a `<Dial>`.
//!
//! Every address voxide reaches here is the operator's: Twilio's API (`--twilio-api-url`) and
//! its own public URL (`--public-url`). The number called is checked to be one.

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use super::access::AccessOptions;
use super::carrier_api::{self, AnswerError};
use crate::secret::Secret;

/// Twilio's REST API.
pub const DEFAULT_API: &str = "https://api.twilio.com";

/// Places and hands over calls through one Twilio account.
pub(crate) struct Dialer {
    api: String,
    account_sid: String,
    auth_token: Secret,
    /// voxide's public origin, `https://host` (the stream's URL is its `wss://` twin); calls
    /// are placed only with it.
    public: Option<String>,
    client: reqwest::Client,
}

/// One call for Twilio to dial.
pub(crate) struct Dial<'a> {
    /// The session's id: the stream's and the status callback's URL carry it.
    pub(crate) id: &'a str,
    /// E.164 numbers.
    pub(crate) to: &'a str,
    pub(crate) from: &'a str,
    pub(crate) ring_for: Duration,
    pub(crate) time_limit: Option<Duration>,
}

/// Why Twilio placed no call.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    /// Twilio refused the request as made: a number it cannot call, a `from` not the
    /// account's.
    #[error("Twilio refused the call: {message} (Twilio error {code})")]
    Refused {
        /// Twilio's error code (21211: an invalid `To`, …).
        code: u32,
        /// Twilio's words.
        message: String,
    },
    /// The account's credentials were refused, or Twilio answered what is not a call.
    #[error("Twilio's API: {0}")]
    Account(String),
    /// Twilio could not be reached, or failed.
    #[error("Twilio's API did not answer: {0}")]
    Unreachable(String),
}

impl From<DialError> for super::ApiError {
    fn from(e: DialError) -> Self {
        match e {
            DialError::Refused { .. } => Self::BadRequest(e.to_string()),
            // The operator's credentials, or Twilio's answer: the log has the detail.
            DialError::Account(_) => Self::Internal(e.to_string()),
            DialError::Unreachable(_) => Self::Upstream(e.to_string()),
        }
    }
}

/// Twilio's answer to a call's creation (the fields voxide reads).
#[derive(Debug, Deserialize)]
struct Created {
    sid: String,
}

/// Twilio's error body.
#[derive(Debug, Deserialize)]
struct Refusal {
    #[serde(default)]
    code: u32,
    #[serde(default)]
    message: String,
}

impl Dialer {
    /// A dialer where the account's id and its auth token are set.
    pub(crate) fn new(access: &AccessOptions, api: Option<&str>) -> Option<Self> {
        let account_sid = access.twilio_account_sid.clone()?;
        let auth_token = access.twilio_auth_token.clone()?;
        let public = access.public_url.as_deref().and_then(http_origin);
        let client = carrier_api::client()?;
        Some(Self {
            api: api.unwrap_or(DEFAULT_API).trim_end_matches('/').to_owned(),
            account_sid,
            auth_token,
            public,
            client,
        })
    }

    /// Whether calls can be placed: voxide's public URL is known, for the stream and the
    /// status callbacks.
    pub(crate) fn places_calls(&self) -> bool {
        self.public.is_some()
    }

    /// Where Twilio streams call `id` once answered.
    pub(crate) fn stream_url(&self, id: &str) -> String {
        let public = self.public.as_deref().unwrap_or_default();
        let origin = match public.strip_prefix("https://") {
            Some(host) => format!("wss://{host}"),
            None => format!("ws://{}", public.trim_start_matches("http://")),
        };
        format!("{origin}/calls/{id}/stream")
    }

    /// Where Twilio reports call `id`'s progress.
    pub(crate) fn status_url(&self, id: &str) -> String {
        let public = self.public.as_deref().unwrap_or_default();
        format!("{public}/calls/{id}/status")
    }

    /// Whether `signature` is Twilio's over a POST of `params` to call `id`'s status URL.
    pub(crate) fn signed_status(
        &self,
        id: &str,
        params: &[(String, String)],
        signature: &str,
    ) -> bool {
        let expected = form_signature(self.auth_token.expose(), &self.status_url(id), params);
        crate::secret::same_secret(expected.as_bytes(), signature.trim().as_bytes())
    }

    /// Asks Twilio to dial; its call's sid (`CA…`) once the call is queued.
    pub(crate) async fn dial(&self, call: &Dial<'_>) -> Result<String, DialError> {
        let twiml = format!(
            "<Response><Connect><Stream url=\"{}\"/></Connect></Response>",
            xml_escape(&self.stream_url(call.id))
        );
        // The serializer is not `Send`: it is gone before the request is.
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("To", call.to)
                .append_pair("From", call.from)
                .append_pair("Twiml", &twiml)
                .append_pair("Timeout", &call.ring_for.as_secs().to_string())
                .append_pair("StatusCallback", &self.status_url(call.id))
                .append_pair("StatusCallbackMethod", "POST");
            for event in ["initiated", "ringing", "answered", "completed"] {
                form.append_pair("StatusCallbackEvent", event);
            }
            if let Some(limit) = call.time_limit {
                form.append_pair("TimeLimit", &limit.as_secs().to_string());
            }
            form.finish()
        };
        let url = format!(
            "{}/2010-04-01/Accounts/{}/Calls.json",
            self.api, self.account_sid
        );
        let created = self.post(&url, form).await?;
        let created: Created = serde_json::from_slice(&created)
            .map_err(|e| DialError::Account(format!("an answer that is not a call: {e}")))?;
        if is_call_sid(&created.sid) {
            Ok(created.sid)
        } else {
            Err(DialError::Account(format!(
                "a call sid that is not one: {:.40?}",
                created.sid
            )))
        }
    }

    /// Hands call `call_sid` over to `to` (a number or a `sip:` URI, from the bot file): the
    /// call gets new TwiML, a `<Dial>`, so Twilio stops its stream and dials `to` for the
    /// caller.
    pub(crate) async fn transfer(&self, call_sid: &str, to: &str) -> Result<(), DialError> {
        if !is_call_sid(call_sid) {
            return Err(DialError::Account(format!(
                "a call sid that is not one: {call_sid:.40?}"
            )));
        }
        let dial = if to.starts_with("sip:") {
            format!("<Sip>{}</Sip>", xml_escape(to))
        } else {
            xml_escape(to)
        };
        let twiml = format!("<Response><Dial>{dial}</Dial></Response>");
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("Twiml", &twiml)
            .finish();
        let url = format!(
            "{}/2010-04-01/Accounts/{}/Calls/{call_sid}.json",
            self.api, self.account_sid
        );
        self.post(&url, form).await.map(drop)
    }

    /// POSTs `form` to `url` with the account's credentials: Twilio's answer, on success.
    async fn post(&self, url: &str, form: String) -> Result<Vec<u8>, DialError> {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            self.account_sid,
            self.auth_token.expose()
        ));
        let response = self
            .client
            .post(url)
            .header("authorization", format!("Basic {basic}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .map_err(|e| DialError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        let body = carrier_api::bounded_answer(response)
            .await
            .map_err(|e| match e {
                AnswerError::Broken(why) => DialError::Unreachable(why),
                AnswerError::TooLong => DialError::Account(e.to_string()),
            })?;
        if status.is_success() {
            return Ok(body);
        }
        let refusal: Refusal = serde_json::from_slice(&body).unwrap_or(Refusal {
            code: 0,
            message: String::from_utf8_lossy(&body).chars().take(200).collect(),
        });
        match status.as_u16() {
            400 | 404 | 422 => Err(DialError::Refused {
                code: refusal.code,
                message: refusal.message.chars().take(300).collect(),
            }),
            401 | 403 => Err(DialError::Account(format!(
                "the account's credentials were refused ({status}): {}",
                refusal.message
            ))),
            _ => Err(DialError::Unreachable(format!(
                "{status}: {}",
                refusal.message
            ))),
        }
    }
}

/// `https://host[:port]` for a public URL given as `wss://`, `ws://`, `https://` or `http://`;
/// `None` for anything else.
fn http_origin(public: &str) -> Option<String> {
    let public = public.trim_end_matches('/');
    let (scheme, host) = public.split_once("://")?;
    let scheme = match scheme {
        "wss" | "https" => "https",
        "ws" | "http" => "http",
        _ => return None,
    };
    (!host.is_empty() && !host.contains(['/', '?', '#'])).then(|| format!("{scheme}://{host}"))
}

/// Whether `number` is an E.164 number: `+`, then 7 to 15 digits.
pub(crate) fn is_e164(number: &str) -> bool {
    number
        .strip_prefix('+')
        .is_some_and(|d| (7..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `sid` is a Twilio call's sid: `CA` and 32 hex digits.
fn is_call_sid(sid: &str) -> bool {
    sid.len() == 34 && sid.starts_with("CA") && sid[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `X-Twilio-Signature` for a POST of form `params` to `url`: HMAC-SHA1 with the auth token of
/// the URL, then each parameter's name and value, sorted by name, in base64.
pub fn form_signature(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    let mut signed = url.to_owned();
    for (name, value) in sorted {
        signed.push_str(name);
        signed.push_str(value);
    }
    super::access::twilio_signature(auth_token, &signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_is_signed_over_its_url_and_its_sorted_parameters() {
        // Twilio's documented example: this URL and these parameters, auth token 12345.
        let params: Vec<(String, String)> = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .rev()
        .collect();
        assert_eq!(
            form_signature(
                "12345",
                "https://mycompany.com/myapp.php?foo=1&bar=2",
                &params
            ),
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
        );
    }

    #[test]
    fn the_public_url_gives_the_stream_and_the_status_their_schemes() {
        assert_eq!(
            http_origin("wss://voice.example.com/").as_deref(),
            Some("https://voice.example.com")
        );
        assert_eq!(
            http_origin("http://127.0.0.1:7860").as_deref(),
            Some("http://127.0.0.1:7860")
        );
        assert_eq!(http_origin("ftp://x"), None);
        assert_eq!(http_origin("https://x/path"), None);
        let access = AccessOptions {
            twilio_account_sid: Some("AC1".into()),
            twilio_auth_token: Some(Secret::new("t")),
            public_url: Some("wss://voice.example.com".into()),
            ..AccessOptions::default()
        };
        let dialer = Dialer::new(&access, None).expect("a dialer");
        assert_eq!(
            dialer.stream_url("n1.x"),
            "wss://voice.example.com/calls/n1.x/stream"
        );
        assert_eq!(
            dialer.status_url("n1.x"),
            "https://voice.example.com/calls/n1.x/status"
        );
        assert!(dialer.places_calls());
        let no_url = AccessOptions {
            public_url: None,
            ..access
        };
        let dialer = Dialer::new(&no_url, None).expect("a dialer, for transfers");
        assert!(
            !dialer.places_calls(),
            "placing calls needs voxide's public URL"
        );
    }

    #[test]
    fn only_e164_numbers_are_called() {
        for good in ["+15551234567", "+441632960961"] {
            assert!(is_e164(good), "{good}");
        }
        for bad in [
            "15551234567",
            "+1555",
            "+1555123456789012",
            "+1 555 123",
            "sip:a@b",
            "+1555x234567",
        ] {
            assert!(!is_e164(bad), "{bad}");
        }
    }

    #[test]
    fn the_twiml_url_is_escaped() {
        assert_eq!(
            xml_escape("wss://h/calls/a&b\"c"),
            "wss://h/calls/a&amp;b&quot;c"
        );
    }
}
