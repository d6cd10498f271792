//! Calls voxide places (`POST /calls`), and where each stands (`GET /calls/{id}`). The SIP
//! loop (`server::sip`) dials them, or Twilio's REST API (`server::twilio`); a call answered
//! is a session like any other.
//!
//! Who may be called is the operator's choice, never the client's: a `sip:` URI at an address
//! in `--sip-allow`, a number through the PBX voxide is an extension of (`--sip-register`), or
//! a number through the Twilio account of `--twilio-account-sid`. Calls cost money and reach
//! people, so the route needs `--auth-token`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::twilio;
use super::{Admission, ApiError, App};
use crate::bot::SessionInfo;
use crate::events::{AnsweredBecause, AnsweredBy};

/// How long a phone may ring unless the request says (Twilio's default too).
const RING_FOR: Duration = Duration::from_secs(60);
/// The longest ringing and the longest call a request may ask for.
const MOST_RING: Duration = Duration::from_secs(600);
const MOST_TIME: Duration = Duration::from_secs(4 * 3600);
/// Calls whose state is kept for `GET /calls/{id}`; the oldest finished go first.
const BOOK: usize = 1_000;
/// The longest user part (a number, an extension) in `to` and `from`.
const MOST_USER: usize = 64;
/// How long past its ringing a call placed through Twilio waits for its stream before its
/// place is given up (Twilio's status callback says sooner when it fails).
const STREAM_GRACE: Duration = Duration::from_secs(30);

/// Which way a call goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Via {
    /// voxide's own SIP user agent (`--sip-listen`).
    Sip,
    /// Twilio's REST API; the answered call streams back over Media Streams.
    Twilio,
}

/// `POST /calls`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallRequest {
    /// `sip:user@address[:port]` (an address in `--sip-allow`), or a number or extension the
    /// PBX of `--sip-register` routes.
    to: String,
    /// The caller's user part (`voxide` unless given; the extension's own through a PBX).
    #[serde(default)]
    from: Option<String>,
    /// The bot that talks (the default unless given).
    #[serde(default)]
    bot: Option<String>,
    /// The session's data, as `/start`'s `body`: tools get it as `request_data`.
    #[serde(default)]
    body: Option<Value>,
    /// How long the phone may ring, in seconds (60 unless given, 600 at most).
    #[serde(default)]
    ring_timeout_s: Option<u64>,
    /// The call's longest duration, in seconds (4 hours at most): voxide hangs up then.
    #[serde(default)]
    time_limit_s: Option<u64>,
    /// `sip` or `twilio`; unless given, SIP where this node has `--sip-listen`, else Twilio.
    #[serde(default)]
    via: Option<Via>,
}

/// A call for the SIP loop to place.
pub(crate) struct Placing {
    /// What `to` asked for, as written.
    pub(crate) to: String,
    pub(crate) from: Option<String>,
    pub(crate) info: SessionInfo,
    pub(crate) admission: Admission,
    pub(crate) ring_for: Duration,
    pub(crate) time_limit: Option<Duration>,
    /// The INVITE went out, or why not.
    pub(crate) placed: oneshot::Sender<Result<(), ApiError>>,
}

/// Where a call placed stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum CallState {
    /// The INVITE is out.
    Calling,
    /// The phone rings.
    Ringing,
    /// Answered: the bot talks.
    Answered,
    /// Answered, and over: who hung up.
    Ended {
        /// `callee_hung_up`, `hung_up`, `time_limit`, …
        reason: String,
    },
    /// Never answered: busy, declined, no answer, unreachable.
    Failed {
        /// `486 Busy Here`, `no answer`, `unreachable`, …
        reason: String,
    },
}

impl CallState {
    fn finished(&self) -> bool {
        matches!(self, CallState::Ended { .. } | CallState::Failed { .. })
    }
}

/// The calls placed, shared by the API and the SIP loop.
#[derive(Default)]
pub(crate) struct Outbound {
    /// The SIP loop's queue; set when the loop starts.
    dialing: OnceLock<mpsc::Sender<Placing>>,
    book: Mutex<Book>,
    /// Calls Twilio dials, until their stream comes.
    streams: Mutex<HashMap<String, Awaiting>>,
}

/// A call Twilio dials, waiting for its stream: the session it becomes, and its place.
pub(crate) struct Awaiting {
    pub(crate) info: SessionInfo,
    pub(crate) admission: Admission,
    /// Twilio's sid for the call: its stream's `start` must name it.
    pub(crate) call_sid: String,
}

#[derive(Default)]
struct Book {
    states: HashMap<String, Entry>,
    order: VecDeque<String>,
}

/// One call in the book.
struct Entry {
    to: String,
    state: CallState,
    /// Twilio's sid for a call it dials.
    call_sid: Option<String>,
    /// Who answered, once the bot told (a bot with `[voicemail]`).
    answered_by: Option<(AnsweredBy, AnsweredBecause)>,
}

impl Outbound {
    /// The SIP loop takes calls to place from here on.
    pub(crate) fn open(&self) -> mpsc::Receiver<Placing> {
        let (tx, rx) = mpsc::channel(64);
        let _ = self.dialing.set(tx);
        rx
    }

    /// Notes where call `id` stands.
    pub(crate) fn note(&self, id: &str, state: CallState) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = book.states.get_mut(id) {
            entry.state = state;
        }
    }

    /// Notes who answered call `id`, as its bot told.
    pub(crate) fn note_answerer(&self, id: &str, by: AnsweredBy, because: AnsweredBecause) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = book.states.get_mut(id) {
            entry.answered_by = Some((by, because));
        }
    }

    fn enter(&self, id: &str, to: &str) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        if book.order.len() >= BOOK
            && let Some(at) = book
                .order
                .iter()
                .position(|id| book.states.get(id).is_none_or(|e| e.state.finished()))
            && let Some(old) = book.order.remove(at)
        {
            book.states.remove(&old);
        }
        book.order.push_back(id.to_owned());
        let entry = Entry {
            to: to.to_owned(),
            state: CallState::Calling,
            call_sid: None,
            answered_by: None,
        };
        book.states.insert(id.to_owned(), entry);
    }

    /// Call `id`'s stream has come: its session and place, once.
    pub(crate) fn take_stream(&self, id: &str) -> Option<Awaiting> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    /// Twilio dials call `id`: its session waits for the stream.
    fn await_stream(&self, id: &str, awaiting: Awaiting) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = book.states.get_mut(id) {
            entry.call_sid = Some(awaiting.call_sid.clone());
        }
        drop(book);
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), awaiting);
    }

    /// Notes Twilio's report on call `id`, if `call_sid` is the call's: a failure frees the
    /// call's place, and an end does not overwrite how the stream ended.
    fn progress(&self, id: &str, call_sid: &str, state: CallState) -> bool {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = book.states.get_mut(id) else {
            return false;
        };
        if entry.call_sid.as_deref() != Some(call_sid) {
            return false;
        }
        let failed = matches!(state, CallState::Failed { .. });
        let keep = match (&entry.state, &state) {
            (CallState::Ended { .. } | CallState::Failed { .. }, _) => true,
            // The stream said it first.
            (CallState::Answered, CallState::Calling | CallState::Ringing) => true,
            _ => false,
        };
        if !keep {
            entry.state = state;
        }
        drop(book);
        if failed {
            self.take_stream(id);
        }
        true
    }

    fn forget(&self, id: &str) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        book.states.remove(id);
        book.order.retain(|i| i != id);
    }

    fn state(&self, id: &str) -> Option<(String, CallState)> {
        let book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        book.states.get(id).map(|e| (e.to.clone(), e.state.clone()))
    }

    fn answered_by(&self, id: &str) -> Option<(AnsweredBy, AnsweredBecause)> {
        let book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        book.states.get(id).and_then(|e| e.answered_by)
    }

    fn call_sid(&self, id: &str) -> Option<String> {
        let book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        book.states.get(id).and_then(|e| e.call_sid.clone())
    }
}

/// A call's progress as Twilio reports it (`CallStatus`), in voxide's terms; `None` for a
/// status that changes nothing.
fn twilio_progress(call_status: &str) -> Option<CallState> {
    let failed = |reason: &str| {
        Some(CallState::Failed {
            reason: reason.into(),
        })
    };
    match call_status {
        "queued" | "initiated" => Some(CallState::Calling),
        "ringing" => Some(CallState::Ringing),
        "in-progress" => Some(CallState::Answered),
        "completed" => Some(CallState::Ended {
            reason: "completed".into(),
        }),
        "busy" => failed("busy"),
        "no-answer" => failed("no answer"),
        "canceled" => failed("canceled"),
        "failed" => failed("failed"),
        _ => None,
    }
}

/// Whether `user` can be a SIP URI's user part as voxide writes one: a number or a name.
pub(crate) fn plain_user(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= MOST_USER
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+*#._-".contains(&b))
}

/// `POST /calls`: places a call, 201 with its session id once the INVITE is out.
pub(crate) async fn place(
    State(app): State<Arc<App>>,
    request: Result<Json<CallRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(request) = request?;
    if app.access.options().auth_token.is_none() {
        return Err(ApiError::Forbidden(
            "placing calls needs --auth-token: calls cost money and reach people".into(),
        ));
    }
    if let Some(from) = &request.from
        && !plain_user(from)
    {
        return Err(ApiError::BadRequest(format!(
            "from {from:.80?}: a number or a name of letters, digits and +*#._-, at most {MOST_USER}"
        )));
    }
    let seconds = |s: u64, most: Duration, name: &str| {
        let asked = Duration::from_secs(s);
        if s == 0 || asked > most {
            Err(ApiError::BadRequest(format!(
                "{name}: 1 to {} seconds",
                most.as_secs()
            )))
        } else {
            Ok(asked)
        }
    };
    let ring_for = match request.ring_timeout_s {
        Some(s) => seconds(s, MOST_RING, "ring_timeout_s")?,
        None => RING_FOR,
    };
    let time_limit = request
        .time_limit_s
        .map(|s| seconds(s, MOST_TIME, "time_limit_s"))
        .transpose()?;
    let mut data = match request.body {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(ApiError::BadRequest("body: an object".into())),
    };
    if serde_json::to_vec(&data).map_or(0, |b| b.len()) > super::webrtc::MAX_START_BODY {
        return Err(ApiError::TooLarge(format!(
            "body: at most {} bytes are kept for the session",
            super::webrtc::MAX_START_BODY
        )));
    }
    if let Some(bot) = request.bot {
        app.bots.find(&bot)?;
        data.insert("bot".into(), Value::String(bot));
    }
    let via = match request.via {
        Some(via) => via,
        None if app.outbound.dialing.get().is_some() => Via::Sip,
        None => Via::Twilio,
    };
    let route = match via {
        Via::Sip => Route::Sip(app.outbound.dialing.get().ok_or_else(|| {
            ApiError::NotFound("this node places no SIP calls: it needs --sip-listen".into())
        })?),
        Via::Twilio => {
            let dialer = app
                .twilio
                .as_ref()
                .filter(|d| d.places_calls())
                .ok_or_else(|| {
                    ApiError::NotFound(
                        "this node places no calls through Twilio: it needs --twilio-account-sid, \
                     TWILIO_AUTH_TOKEN and --public-url"
                            .into(),
                    )
                })?;
            let from = request.from.as_deref().unwrap_or_default();
            if !twilio::is_e164(&request.to) || !twilio::is_e164(from) {
                return Err(ApiError::BadRequest(
                    "a call through Twilio needs `to` and `from` as E.164 numbers (+15551234567)"
                        .into(),
                ));
            }
            Route::Twilio(dialer)
        }
    };
    let admission = app.admit()?;
    let id = app.cluster.mint();
    let info = SessionInfo {
        id: id.clone(),
        request_data: if data.is_empty() {
            Value::Null
        } else {
            Value::Object(data)
        },
        placed: true,
    };
    app.outbound.enter(&id, &request.to);
    let placed = match route {
        Route::Sip(dialing) => {
            let (placed, answer) = oneshot::channel();
            let placing = Placing {
                to: request.to,
                from: request.from,
                info,
                admission,
                ring_for,
                time_limit,
                placed,
            };
            match dialing.try_send(placing) {
                Ok(()) => answer
                    .await
                    .unwrap_or_else(|_| Err(ApiError::Internal("the SIP loop is gone".into()))),
                Err(_) => Err(ApiError::TooOften("calls are being placed too fast".into())),
            }
        }
        Route::Twilio(dialer) => {
            let dial = twilio::Dial {
                id: &id,
                to: &request.to,
                from: request.from.as_deref().unwrap_or_default(),
                ring_for,
                time_limit,
            };
            match dialer.dial(&dial).await {
                Ok(call_sid) => {
                    let awaiting = Awaiting {
                        info,
                        admission,
                        call_sid,
                    };
                    app.outbound.await_stream(&id, awaiting);
                    tokio::spawn(give_up_waiting(app.clone(), id.clone(), ring_for));
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }
        }
    };
    if let Err(e) = placed {
        app.outbound.forget(&id);
        return Err(e);
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({"session_id": id, "state": "calling", "via": via})),
    ))
}

/// Where a call goes out.
enum Route<'a> {
    Sip(&'a mpsc::Sender<Placing>),
    Twilio(&'a twilio::Dialer),
}

/// Frees the place of a call Twilio dialed whose stream never came.
async fn give_up_waiting(app: Arc<App>, id: String, ring_for: Duration) {
    tokio::time::sleep(ring_for + STREAM_GRACE).await;
    if app.outbound.take_stream(&id).is_some() {
        tracing::warn!(id, "Twilio dialed a call whose stream never came");
        app.outbound.note(
            &id,
            CallState::Failed {
                reason: "no stream from Twilio".into(),
            },
        );
    }
}

/// The most form parameters a status callback may carry (Twilio sends about twenty).
const MOST_PARAMS: usize = 64;

/// `POST /calls/{id}/status`: Twilio's word on a call it dials, signed with the account's
/// auth token over this URL and the form.
pub(crate) async fn twilio_status(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<StatusCode, ApiError> {
    let dialer = app
        .twilio
        .as_ref()
        .filter(|d| d.places_calls())
        .ok_or_else(|| ApiError::NotFound("this node places no calls through Twilio".into()))?;
    let params: Vec<(String, String)> = form_urlencoded::parse(&body)
        .into_owned()
        .take(MOST_PARAMS + 1)
        .collect();
    if params.len() > MOST_PARAMS {
        return Err(ApiError::TooLarge(format!(
            "a status callback carries at most {MOST_PARAMS} parameters"
        )));
    }
    let signature = headers
        .get("x-twilio-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !dialer.signed_status(&id, &params, signature) {
        return Err(ApiError::Unauthorized);
    }
    let field = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let (Some(call_sid), Some(status)) = (field("CallSid"), field("CallStatus")) else {
        return Err(ApiError::BadRequest(
            "a status callback names its CallSid and CallStatus".into(),
        ));
    };
    if let Some(state) = twilio_progress(status)
        && !app.outbound.progress(&id, call_sid, state)
    {
        return Err(ApiError::NotFound(format!(
            "no call {id:.80} placed here through Twilio as {call_sid:.40}"
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /calls/{id}`: where a call placed stands.
pub(crate) async fn state(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (to, state) = app
        .outbound
        .state(&id)
        .ok_or_else(|| ApiError::NotFound(format!("no call {id:.80} placed here")))?;
    let answered = app.outbound.answered_by(&id);
    let call_sid = app.outbound.call_sid(&id);
    let mut answer = serde_json::to_value(state).unwrap_or_default();
    answer["session_id"] = Value::String(id);
    answer["to"] = Value::String(to);
    if let Some((by, because)) = answered {
        answer["answered_by"] = json!(by);
        answer["answered_because"] = json!(because);
    }
    if let Some(sid) = call_sid {
        answer["call_sid"] = Value::String(sid);
    }
    Ok(Json(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_book_forgets_the_oldest_finished_call_first() {
        let outbound = Outbound::default();
        outbound.enter("live", "sip:a@127.0.0.1");
        for n in 1..BOOK {
            outbound.enter(&n.to_string(), "sip:b@127.0.0.1");
            outbound.note(
                &n.to_string(),
                CallState::Failed {
                    reason: "486 Busy Here".into(),
                },
            );
        }
        outbound.enter("new", "sip:c@127.0.0.1");
        assert!(outbound.state("live").is_some(), "a live call is kept");
        assert!(outbound.state("1").is_none(), "the oldest finished went");
        assert!(outbound.state("2").is_some());
        assert_eq!(
            outbound.state("new"),
            Some(("sip:c@127.0.0.1".into(), CallState::Calling))
        );
    }

    #[test]
    fn twilio_statuses_map_onto_a_calls_states() {
        assert_eq!(twilio_progress("ringing"), Some(CallState::Ringing));
        assert_eq!(twilio_progress("in-progress"), Some(CallState::Answered));
        assert_eq!(
            twilio_progress("no-answer"),
            Some(CallState::Failed {
                reason: "no answer".into()
            })
        );
        assert_eq!(twilio_progress("something-new"), None);
    }

    #[test]
    fn a_user_part_is_a_number_or_a_plain_name() {
        for good in ["+15551234567", "1001", "bob.smith", "*72#"] {
            assert!(plain_user(good), "{good}");
        }
        for bad in ["", "a@b", "a;b", "a b", "<sip:x>", &"9".repeat(65)] {
            assert!(!plain_user(bad), "{bad}");
        }
    }
}
