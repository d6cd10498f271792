//! SDP offer and answer for a telephone call's audio (RFC 4566, RFC 3264): the caller's
//! address and port, the codec both sides speak (Opus or G.722 in wideband, PCMU or PCMA at
//! 8 kHz), and RFC 4733 telephone-events when the caller offers them.

use std::net::IpAddr;

use super::SipError;

/// The RTP clock of G.711 and G.722 (RFC 3551) and of most telephone-events: 8 kHz.
pub const CLOCK: u32 = 8_000;
/// Opus's RTP clock, whatever its audio's band (RFC 7587).
pub const OPUS_CLOCK: u32 = 48_000;
/// The payload type voxide gives Opus in its own offer (a dynamic one).
const OPUS_PAYLOAD_TYPE: u8 = 96;
/// The payload type voxide gives telephone-events in its own offer.
const EVENTS_PAYLOAD_TYPE: u8 = 101;

/// An audio codec voxide speaks on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// G.711 μ-law (static payload type 0).
    Pcmu,
    /// G.711 A-law (static payload type 8).
    Pcma,
    /// G.722, wideband (static payload type 9).
    G722,
    /// Opus (RFC 7587, a dynamic payload type), decoded and encoded here in wideband.
    Opus,
}

impl Codec {
    /// Its name in an `rtpmap`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Pcmu => "PCMU",
            Codec::Pcma => "PCMA",
            Codec::G722 => "G722",
            Codec::Opus => "opus",
        }
    }

    /// The rate of its audio on a call: 16 kHz for G.722 and Opus (which voxide speaks in
    /// wideband, all a phone call's speech needs), 8 kHz for G.711.
    pub fn rate(self) -> u32 {
        match self {
            Codec::G722 | Codec::Opus => crate::audio::g722::RATE,
            Codec::Pcmu | Codec::Pcma => CLOCK,
        }
    }

    /// The clock of its RTP timestamps: 48 kHz for Opus, 8 kHz for the others (G.722's too).
    pub fn clock(self) -> u32 {
        match self {
            Codec::Opus => OPUS_CLOCK,
            Codec::Pcmu | Codec::Pcma | Codec::G722 => CLOCK,
        }
    }

    /// The payload type voxide gives it when it offers: the static one, 96 for Opus.
    pub fn payload_type(self) -> u8 {
        match self {
            Codec::Pcmu => 0,
            Codec::Pcma => 8,
            Codec::G722 => 9,
            Codec::Opus => OPUS_PAYLOAD_TYPE,
        }
    }

    /// Its `rtpmap` after the payload type: Opus is always written as two channels (RFC 7587
    /// §7), whatever is sent.
    pub fn rtpmap(self) -> String {
        match self {
            Codec::Opus => format!("opus/{OPUS_CLOCK}/2"),
            other => format!("{}/{CLOCK}", other.name()),
        }
    }

    /// The codec an `rtpmap`'s name and clock stand for.
    fn named(name: &str, clock: u32) -> Option<Self> {
        [Codec::Pcmu, Codec::Pcma, Codec::G722, Codec::Opus]
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(name) && c.clock() == clock)
    }
}

/// What the caller offered, as far as audio goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// Where the caller takes audio.
    pub address: IpAddr,
    /// On which port.
    pub port: u16,
    /// The payload types of `m=audio`, in the caller's order of preference.
    pub formats: Vec<u8>,
    /// Each payload type's `rtpmap`: name and clock rate.
    pub maps: Vec<(u8, String, u32)>,
}

/// The codec and events the call uses: the payload types the caller gave them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen {
    /// The audio codec.
    pub codec: Codec,
    /// Its payload type.
    pub payload_type: u8,
    /// The telephone-event payload type, if the caller offered it at 8 kHz or at the codec's
    /// clock.
    pub events: Option<u8>,
    /// The clock of those events' durations: the codec's when offered so, else 8 kHz.
    pub events_clock: u32,
}

/// The most lines an offer may hold.
const MAX_LINES: usize = 256;

impl Offer {
    /// Reads an offer's session address and its first audio stream.
    pub fn parse(text: &str) -> Result<Self, SipError> {
        let mut session_address = None;
        let mut media_address = None;
        let mut audio: Option<(u16, Vec<u8>)> = None;
        let mut maps = Vec::new();
        let mut in_audio = false;
        for (n, line) in text.lines().enumerate() {
            if n == MAX_LINES {
                return Err(SipError::BadOffer(format!("more than {MAX_LINES} lines")));
            }
            let line = line.trim_end();
            if let Some(rest) = line.strip_prefix("m=") {
                in_audio = false;
                let mut fields = rest.split_whitespace();
                if fields.next() != Some("audio") || audio.is_some() {
                    continue;
                }
                let port = fields.next().and_then(|p| p.parse::<u16>().ok());
                let proto = fields.next();
                let formats: Vec<u8> = fields.filter_map(|f| f.parse().ok()).collect();
                match (port, proto) {
                    (Some(port), Some("RTP/AVP" | "RTP/AVPF")) => {
                        audio = Some((port, formats));
                        in_audio = true;
                    }
                    _ => {
                        return Err(SipError::BadOffer(format!(
                            "m=audio needs a port and plain RTP/AVP: {line:?}"
                        )));
                    }
                }
            } else if let Some(rest) = line.strip_prefix("c=") {
                let address = connection(rest)?;
                if in_audio {
                    media_address = Some(address);
                } else if audio.is_none() {
                    session_address = Some(address);
                }
            } else if let Some(rest) = line.strip_prefix("a=rtpmap:")
                && in_audio
            {
                let Some((pt, map)) = rest.split_once(' ') else {
                    continue;
                };
                let mut parts = map.split('/');
                if let (Ok(pt), Some(name), Some(Ok(rate))) = (
                    pt.parse::<u8>(),
                    parts.next(),
                    parts.next().map(str::parse::<u32>),
                ) {
                    maps.push((pt, name.to_owned(), rate));
                }
            }
        }
        let (port, formats) =
            audio.ok_or_else(|| SipError::BadOffer("no m=audio stream".into()))?;
        let address = media_address
            .or(session_address)
            .ok_or_else(|| SipError::BadOffer("no c= address".into()))?;
        Ok(Self {
            address,
            port,
            formats,
            maps,
        })
    }

    /// The payload type's name and rate: its `rtpmap`, or the static table for 0, 8 and 9.
    fn map(&self, pt: u8) -> Option<(&str, u32)> {
        if let Some((_, name, rate)) = self.maps.iter().find(|(p, _, _)| *p == pt) {
            return Some((name.as_str(), *rate));
        }
        match pt {
            0 => Some(("PCMU", CLOCK)),
            8 => Some(("PCMA", CLOCK)),
            9 => Some(("G722", CLOCK)),
            _ => None,
        }
    }

    /// The first of the caller's formats voxide speaks, and its telephone-events: at the
    /// codec's clock (RFC 4733 §2.1) when offered so, else at 8 kHz.
    pub fn choose(&self) -> Option<Chosen> {
        let (codec, payload_type) = self.formats.iter().find_map(|pt| {
            let (name, clock) = self.map(*pt)?;
            Some((Codec::named(name, clock)?, *pt))
        })?;
        let events_at = |clock: u32| {
            self.formats.iter().copied().find(|pt| {
                self.map(*pt).is_some_and(|(name, rate)| {
                    name.eq_ignore_ascii_case("telephone-event") && rate == clock
                })
            })
        };
        let (events, events_clock) = match events_at(codec.clock()) {
            Some(pt) => (Some(pt), codec.clock()),
            None => (events_at(CLOCK), CLOCK),
        };
        Some(Chosen {
            codec,
            payload_type,
            events,
            events_clock,
        })
    }
}

/// `IN IP4 a.b.c.d` (or IP6).
fn connection(rest: &str) -> Result<IpAddr, SipError> {
    let mut fields = rest.split_whitespace();
    match (fields.next(), fields.next(), fields.next()) {
        (Some("IN"), Some("IP4" | "IP6"), Some(address)) => address
            .split('/')
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| SipError::BadOffer(format!("c= address {address:?}"))),
        _ => Err(SipError::BadOffer(format!("c={rest:?}"))),
    }
}

/// voxide's answer: audio at `address:port` in `chosen`'s codec, and its telephone-events.
pub fn answer(address: IpAddr, port: u16, chosen: Chosen, session: u64) -> String {
    let family = if address.is_ipv4() { "IP4" } else { "IP6" };
    let mut formats = chosen.payload_type.to_string();
    if let Some(events) = chosen.events {
        formats.push_str(&format!(" {events}"));
    }
    let mut sdp = format!(
        "v=0\r\no=voxide {session} {session} IN {family} {address}\r\ns=voxide\r\n\
         c=IN {family} {address}\r\nt=0 0\r\nm=audio {port} RTP/AVP {formats}\r\n\
         a=rtpmap:{} {}\r\n",
        chosen.payload_type,
        chosen.codec.rtpmap()
    );
    if chosen.codec == Codec::Opus {
        sdp.push_str(&format!("a=fmtp:{} {OPUS_FMTP}\r\n", chosen.payload_type));
    }
    if let Some(events) = chosen.events {
        sdp.push_str(&format!(
            "a=rtpmap:{events} telephone-event/{}\r\na=fmtp:{events} 0-15\r\n",
            chosen.events_clock
        ));
    }
    sdp.push_str("a=ptime:20\r\na=sendrecv\r\n");
    sdp
}

/// What voxide asks of the Opus it takes and says of the Opus it sends: mono, in-band FEC.
const OPUS_FMTP: &str = "useinbandfec=1; stereo=0; sprop-stereo=0";

/// voxide's offer on a call it places: audio at `address:port` in Opus and G.722 (wideband,
/// first), PCMU or PCMA, and telephone-events as payload type 101.
pub fn offer(address: IpAddr, port: u16, session: u64) -> String {
    let family = if address.is_ipv4() { "IP4" } else { "IP6" };
    let (opus, events) = (OPUS_PAYLOAD_TYPE, EVENTS_PAYLOAD_TYPE);
    format!(
        "v=0\r\no=voxide {session} {session} IN {family} {address}\r\ns=voxide\r\n\
         c=IN {family} {address}\r\nt=0 0\r\nm=audio {port} RTP/AVP {opus} 9 0 8 {events}\r\n\
         a=rtpmap:{opus} {}\r\na=fmtp:{opus} {OPUS_FMTP}\r\n\
         a=rtpmap:9 G722/8000\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n\
         a=rtpmap:{events} telephone-event/8000\r\na=fmtp:{events} 0-15\r\na=ptime:20\r\n\
         a=sendrecv\r\n",
        Codec::Opus.rtpmap()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SIPp's `uac_pcap` offer.
    const SIPP: &str = "v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\n\
        c=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 8 101\r\n\
        a=rtpmap:8 PCMA/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-11,16\r\n";

    #[test]
    fn sipps_offer_chooses_pcma_with_its_telephone_events() {
        let offer = Offer::parse(SIPP).expect("offer");
        assert_eq!(offer.address, "127.0.0.1".parse::<IpAddr>().expect("ip"));
        assert_eq!(offer.port, 6000);
        assert_eq!(
            offer.choose(),
            Some(Chosen {
                codec: Codec::Pcma,
                payload_type: 8,
                events: Some(101),
                events_clock: 8_000,
            })
        );
    }

    #[test]
    fn the_callers_order_decides_and_static_types_need_no_rtpmap() {
        let offer = Offer::parse("v=0\r\nc=IN IP4 10.0.0.9\r\nm=audio 4000 RTP/AVP 8 9 0\r\n")
            .expect("offer");
        let chosen = offer.choose().expect("PCMA");
        assert_eq!(
            (chosen.codec, chosen.payload_type, chosen.events),
            (Codec::Pcma, 8, None)
        );
        let offer = Offer::parse(
            "v=0\r\nc=IN IP4 10.0.0.9\r\nm=audio 4000 RTP/AVP 9 0 8\r\na=rtpmap:9 G722/8000\r\n",
        )
        .expect("offer");
        let chosen = offer.choose().expect("G.722");
        assert_eq!(
            (chosen.codec, chosen.payload_type, chosen.codec.rate()),
            (Codec::G722, 9, 16_000)
        );
        let answer = answer("192.0.2.1".parse().expect("ip"), 10_000, chosen, 7);
        let back = Offer::parse(&answer).expect("the answer reads as SDP");
        assert_eq!((back.port, back.formats.clone()), (10_000, vec![9]));
        assert!(answer.contains("a=rtpmap:9 G722/8000"), "{answer}");
    }

    #[test]
    fn an_offer_without_a_common_codec_or_an_address_is_told_apart() {
        let opus_at_16k = Offer::parse(
            "v=0\r\nc=IN IP4 10.0.0.9\r\nm=audio 4000 RTP/AVP 111 18\r\na=rtpmap:111 opus/16000\r\n",
        )
        .expect("offer");
        assert_eq!(
            opus_at_16k.choose(),
            None,
            "Opus runs on a 48 kHz clock, G.729 is not spoken"
        );
        assert!(Offer::parse("v=0\r\nm=audio 4000 RTP/AVP 0\r\n").is_err());
        assert!(Offer::parse("v=0\r\nc=IN IP4 10.0.0.9\r\n").is_err());
        assert!(Offer::parse("v=0\r\nc=IN IP4 x\r\nm=audio 4000 RTP/AVP 0\r\n").is_err());
        assert!(Offer::parse("v=0\r\nc=IN IP4 10.0.0.9\r\nm=audio 4000 RTP/SAVP 0\r\n").is_err());
    }

    /// baresip 1.0's offer with Opus put first, as its `audio_codecs` account parameter does.
    const BARESIP_OPUS: &str = "v=0\r\no=- 2414296656 655741758 IN IP4 192.0.2.2\r\ns=-\r\n\
        c=IN IP4 192.0.2.2\r\nt=0 0\r\na=tool:baresip 1.0.0\r\nm=audio 23314 RTP/AVP 96 0 101\r\n\
        a=rtpmap:0 PCMU/8000\r\na=rtpmap:96 opus/48000/2\r\n\
        a=fmtp:96 stereo=1;sprop-stereo=1;maxaveragebitrate=28000\r\n\
        a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=sendrecv\r\na=ptime:20\r\n";

    #[test]
    fn opus_offered_first_is_answered_in_opus_on_its_48_khz_clock_with_8_khz_events() {
        let offer = Offer::parse(BARESIP_OPUS).expect("offer");
        let chosen = offer.choose().expect("Opus");
        assert_eq!(
            chosen,
            Chosen {
                codec: Codec::Opus,
                payload_type: 96,
                events: Some(101),
                events_clock: 8_000,
            }
        );
        assert_eq!(
            (chosen.codec.rate(), chosen.codec.clock()),
            (16_000, 48_000)
        );
        let answered = answer("192.0.2.1".parse().expect("ip"), 10_000, chosen, 7);
        assert!(
            answered.contains("m=audio 10000 RTP/AVP 96 101\r\n"),
            "{answered}"
        );
        assert!(
            answered.contains("a=rtpmap:96 opus/48000/2\r\n"),
            "{answered}"
        );
        assert!(answered.contains("a=fmtp:96 useinbandfec=1"), "{answered}");
        assert!(
            answered.contains("a=rtpmap:101 telephone-event/8000\r\n"),
            "{answered}"
        );
        // Events offered on Opus's own clock are taken on it, and answered so.
        let both = Offer::parse(&BARESIP_OPUS.replace(
            "m=audio 23314 RTP/AVP 96 0 101",
            "m=audio 23314 RTP/AVP 96 0 101 102\r\na=rtpmap:102 telephone-event/48000",
        ))
        .expect("offer");
        let chosen = both.choose().expect("Opus");
        assert_eq!((chosen.events, chosen.events_clock), (Some(102), 48_000));
        let answered = answer("192.0.2.1".parse().expect("ip"), 10_000, chosen, 7);
        assert!(
            answered.contains("a=rtpmap:102 telephone-event/48000\r\n"),
            "{answered}"
        );
    }

    #[test]
    fn voxides_offer_reads_back_opus_and_wideband_first_with_its_events() {
        let offer = offer("192.0.2.4".parse().expect("ip"), 20_000, 7);
        let back = Offer::parse(&offer).expect("the offer reads as SDP");
        assert_eq!(back.address, "192.0.2.4".parse::<IpAddr>().expect("ip"));
        assert_eq!(
            (back.port, back.formats.clone()),
            (20_000, vec![96, 9, 0, 8, 101])
        );
        assert_eq!(
            back.choose(),
            Some(Chosen {
                codec: Codec::Opus,
                payload_type: 96,
                events: Some(101),
                events_clock: 8_000,
            })
        );
    }
}
