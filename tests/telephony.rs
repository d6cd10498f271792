//! Phone calls without a carrier. SIP calls answered by `voxide serve --sip-listen`, placed by a
//! real SIP peer: SIPp (Debian's `sip-tester`, installed by `scripts/setup.sh --test`). The
//! caller speaks recorded audio in A-law over RTP, presses a key (RFC 4733) and hangs up; the
//! server's recording shows what it heard and what the bot said. And Asterisk's AudioSocket
//! (`--audiosocket-listen`), with a client that speaks it as Asterisk does. Needs the models
//! (`scripts/setup.sh`).

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use voxide::audio::alaw;
use voxide::audio::resample::StreamResampler;
use voxide::audio::wav;
use voxide::loadtest::room::{Noise, Room, mix};
use voxide::server::{Network, SipOptions};

mod common;

use common::{HELLO, start_options, test_options};

/// A bot on the embedded models that speaks with espeak-ng (quick to start).
fn espeak_bot() -> voxide::bot::BotOptions {
    voxide::bot::BotOptions {
        voice: voxide::bot::Voice::Espeak,
        ..voxide::bot::BotOptions::default()
    }
}

/// A test server of [`espeak_bot`] that takes SIP calls at `listen` from `allow`, their RTP on
/// `rtp_ports`.
fn sip_options(
    listen: SocketAddr,
    rtp_ports: std::ops::RangeInclusive<u16>,
    allow: Vec<Network>,
) -> voxide::server::ServeOptions {
    let mut options = test_options(vec![espeak_bot()]);
    options.sip = Some(SipOptions {
        listen,
        tcp: false,
        public_ip: None,
        rtp_ports,
        allow,
        register: None,
        users: None,
    });
    options
}

/// A test server's options taking SIP from loopback on a free port, its RTP on `rtp_ports`,
/// recording each call into the fresh folder `name`: the options, the folder, the SIP port.
fn recording_sip(
    name: &str,
    rtp_ports: std::ops::RangeInclusive<u16>,
) -> (voxide::server::ServeOptions, std::path::PathBuf, u16) {
    let records = scratch(name);
    let sip_port = free_udp_port();
    let mut options = sip_options(
        SocketAddr::from(([127, 0, 0, 1], sip_port)),
        rtp_ports,
        Network::loopback(),
    );
    options.record_dir = Some(records.clone());
    (options, records, sip_port)
}

/// A fresh folder of this test's, under the system's temporary folder.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("voxide-telephony-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

/// A free UDP port on loopback.
fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

/// A libpcap file of `payloads` as RTP (payload type `pt`, 20 ms apart) in UDP over IPv4 over
/// Ethernet, as SIPp's `play_pcap_audio` replays them.
fn pcap(payloads: &[Vec<u8>], pt: u8) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65_535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, payload) in payloads.iter().enumerate() {
        let mut rtp = vec![0x80, pt | if i == 0 { 0x80 } else { 0 }];
        rtp.extend_from_slice(&(i as u16).to_be_bytes());
        rtp.extend_from_slice(&((i * 160) as u32).to_be_bytes());
        rtp.extend_from_slice(&0x5151_5151u32.to_be_bytes());
        rtp.extend_from_slice(payload);
        let udp_len = 8 + rtp.len();
        let ip_len = 20 + udp_len;
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&(ip_len as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
        let sum = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&6_000u16.to_be_bytes());
        frame.extend_from_slice(&6_000u16.to_be_bytes());
        frame.extend_from_slice(&(udp_len as u16).to_be_bytes());
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&rtp);
        let micros = i as u32 * 20_000;
        out.extend_from_slice(&(micros / 1_000_000).to_le_bytes());
        out.extend_from_slice(&(micros % 1_000_000).to_le_bytes());
        out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        out.extend_from_slice(&frame);
    }
    out
}

/// The caller's script: an INVITE offering PCMA and telephone-events, the recorded question,
/// time for the answer, the key `1` (SIPp's own RFC 4733 capture), then `#` by SIP INFO, which
/// ends the entry; time for it to be answered, then BYE.
const SCENARIO: &str = r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="voxide caller">
  <send retrans="500"><![CDATA[
INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]caller[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: <sip:caller@[local_ip]:[local_port]>
Max-Forwards: 70
Content-Type: application/sdp
Content-Length: [len]

v=0
o=caller 1 1 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [auto_media_port] RTP/AVP 8 101
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-15
]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rtd="true"/>
  <send><![CDATA[
ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]caller[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 1 ACK
Max-Forwards: 70
Content-Length: 0
]]></send>
  <nop><action><exec play_pcap_audio="hello.pcap"/></action></nop>
  <pause milliseconds="9000"/>
  <nop><action><exec play_pcap_audio="PCAP_DIR/dtmf_2833_1.pcap"/></action></nop>
  <pause milliseconds="600"/>
  <send retrans="500"><![CDATA[
INFO sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]caller[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 2 INFO
Max-Forwards: 70
Content-Type: application/dtmf-relay
Content-Length: [len]

Signal=#
Duration=160
]]></send>
  <recv response="200"/>
  <pause milliseconds="8000"/>
  <send retrans="500"><![CDATA[
BYE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]caller[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 3 BYE
Max-Forwards: 70
Content-Length: 0
]]></send>
  <recv response="200"/>
</scenario>
"#;

/// Where Debian's SIPp keeps its RTP captures.
const PCAP_DIR: &str = "/usr/share/sip-tester";

/// The recorded question, narrowed to a telephone's 8 kHz.
fn question_at_8k() -> Vec<i16> {
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    StreamResampler::new(16_000, 8_000)
        .expect("resampler")
        .process(&hello)
}

/// A folder for a SIPp caller: `scenario` as `caller.xml` (`PCAP_DIR` in it replaced), and the
/// recorded question, narrowed to 8 kHz and A-law, 20 ms a packet, as `hello.pcap`.
fn caller_folder(name: &str, scenario: &str) -> std::path::PathBuf {
    let narrow = question_at_8k();
    let payloads: Vec<Vec<u8>> = narrow
        .chunks(160)
        .map(|c| {
            let mut bytes: Vec<u8> = c.iter().map(|s| alaw::encode(*s)).collect();
            bytes.resize(160, alaw::encode(0));
            bytes
        })
        .collect();
    let work = scratch(name);
    std::fs::write(work.join("hello.pcap"), pcap(&payloads, 8)).expect("pcap");
    std::fs::write(
        work.join("caller.xml"),
        scenario.replace("PCAP_DIR", PCAP_DIR),
    )
    .expect("scenario");
    work
}

/// SIPp placing one call from loopback to voxide's `sip_port`, as `work/caller.xml` says.
async fn sipp_caller(work: &Path, sip_port: u16, extra: &[&str]) -> std::process::Output {
    let caller_port = free_udp_port();
    let sipp = tokio::process::Command::new("sipp")
        .current_dir(work)
        .args([
            "-sf",
            "caller.xml",
            &format!("127.0.0.1:{sip_port}"),
            "-s",
            "agent",
        ])
        .args([
            "-i",
            "127.0.0.1",
            "-mi",
            "127.0.0.1",
            "-p",
            &caller_port.to_string(),
        ])
        .args([
            "-m",
            "1",
            "-timeout",
            "60",
            "-timeout_error",
            "-nostdin",
            "-trace_err",
        ])
        .args(extra)
        .output();
    tokio::time::timeout(Duration::from_secs(90), sipp)
        .await
        .expect("SIPp finished")
        .expect("SIPp runs")
}

/// Asserts that a SIPp run succeeded; `failed` says what went wrong otherwise, with SIPp's
/// output.
fn succeeded(sipp: &std::process::Output, failed: &str) {
    assert!(
        sipp.status.success(),
        "{failed}: {}\n{}",
        String::from_utf8_lossy(&sipp.stdout),
        String::from_utf8_lossy(&sipp.stderr)
    );
}

/// A SIPp run spawned as a task, once it has finished (within `secs`).
async fn finished(
    run: tokio::task::JoinHandle<std::io::Result<std::process::Output>>,
    secs: u64,
) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(secs), run)
        .await
        .expect("SIPp finished")
        .expect("SIPp's task")
        .expect("SIPp runs")
}

/// A server that places calls for the bakery (`POST /calls` with the token `t0k3n`), its RTP
/// on `rtp_ports`, recording each call into `records`; its bot greets whoever answers.
fn bakery(
    records: &Path,
    rtp_ports: std::ops::RangeInclusive<u16>,
) -> voxide::server::ServeOptions {
    let sip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let mut options = sip_options(sip, rtp_ports, Network::loopback());
    options.record_dir = Some(records.to_owned());
    options.access.auth_token = Some(voxide::secret::Secret::new("t0k3n"));
    options.bots[0].greeting = Some("Hello, this is the bakery calling about your cake.".into());
    options
}

/// SIPp as the callee of a call voxide places, running `scenario` (`-sn uas -rtp_echo`, or
/// `-sf callee.xml`) in `work` for one call: its SIP port and its run.
fn sipp_callee(
    work: &Path,
    scenario: &[&str],
) -> (
    u16,
    tokio::task::JoinHandle<std::io::Result<std::process::Output>>,
) {
    let port = free_udp_port();
    // SIPp takes four ports from here (audio and video, RTP and RTCP).
    let media_port = 23_000 + 4 * (std::process::id() % 1_000) as u16;
    let run = tokio::process::Command::new("sipp")
        .args(scenario)
        .args(["-i", "127.0.0.1", "-mi", "127.0.0.1"])
        .args(["-p", &port.to_string(), "-mp", &media_port.to_string()])
        .args(["-m", "1", "-timeout", "90", "-timeout_error", "-nostdin"])
        .current_dir(work)
        .output();
    (port, tokio::spawn(run))
}

/// `POST /calls` with `body` once SIPp listens on `callee_port` (a call it never heard would
/// ring out); the call's session id.
async fn place_call(
    server: SocketAddr,
    body: &str,
    (callee_port, callee): (
        u16,
        &mut tokio::task::JoinHandle<std::io::Result<std::process::Output>>,
    ),
) -> String {
    let token = [("Authorization", "Bearer t0k3n")];
    for _ in 0..200 {
        if callee.is_finished() {
            let out = callee.await.expect("joined").expect("SIPp ran");
            panic!("SIPp stopped: {}", String::from_utf8_lossy(&out.stderr));
        }
        if UdpSocket::bind(("127.0.0.1", callee_port)).is_err() {
            let (status, answer) =
                common::request_with(server, "POST", "/calls", &token, body).await;
            assert_eq!(status, 201, "{answer}");
            let placed: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
            return placed["session_id"]
                .as_str()
                .expect("a session id")
                .to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("SIPp never listened on {callee_port}");
}

/// [`SCENARIO`] for a caller that must authenticate: its first INVITE is challenged (401), it
/// acknowledges the challenge and sends the INVITE again with SIPp's own digest answer
/// (`-au`/`-ap`); the rest of the call follows one CSeq on.
fn authenticating(scenario: &str) -> String {
    let first_send = scenario.find("  <send").expect("an INVITE");
    let invite_end = scenario.find("]]></send>").expect("its end") + "]]></send>\n".len();
    let (head, invite, rest) = (
        &scenario[..first_send],
        &scenario[first_send..invite_end],
        &scenario[invite_end..],
    );
    let challenged = r#"  <recv response="100" optional="true"/>
  <recv response="401" auth="true"/>
  <send><![CDATA[
ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
[last_Via:]
[last_From:]
[last_To:]
[last_Call-ID:]
CSeq: 1 ACK
Max-Forwards: 70
Content-Length: 0
]]></send>
"#;
    let again = invite.replace("CSeq: 1 INVITE", "CSeq: 2 INVITE\n[authentication]");
    let rest = rest
        .replace("CSeq: 3 BYE", "CSeq: 4 BYE")
        .replace("CSeq: 2 INFO", "CSeq: 3 INFO")
        .replace("CSeq: 1 ACK", "CSeq: 2 ACK");
    format!("{head}{invite}{challenged}{again}{rest}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sipp_caller_is_answered_heard_and_its_keys_reach_the_conversation() {
    sipp_call_is_heard("udp", 21_000..=21_499, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sipp_caller_over_tcp_is_answered_on_its_connection_heard_and_its_keys_reach_it() {
    sipp_call_is_heard("tcp", 21_500..=21_999, true).await;
}

/// SIPp's caller (over TCP with `tcp`, one connection for the whole call): the question heard,
/// its RTP key and its INFO key gathered, the bot's answer in the recording.
async fn sipp_call_is_heard(name: &str, rtp_ports: std::ops::RangeInclusive<u16>, tcp: bool) {
    assert!(
        Path::new(PCAP_DIR).join("dtmf_2833_1.pcap").exists(),
        "SIPp is not installed: scripts/setup.sh --test installs sip-tester"
    );
    let (mut options, records, sip_port) = recording_sip(&format!("records-{name}"), rtp_ports);
    if let Some(sip) = &mut options.sip {
        sip.tcp = tcp;
    }
    let _server = start_options(options).await;

    let work = caller_folder(&format!("caller-{name}"), SCENARIO);
    let transport: &[&str] = if tcp { &["-t", "t1"] } else { &[] };
    let sipp = sipp_caller(&work, sip_port, transport).await;
    succeeded(&sipp, "SIPp's call failed");

    let report = report_in(&records).await;
    assert_eq!(report["transport"], "sip");
    let said = user_said(&report);
    // "What's the weather like?", narrowed to a telephone's 8 kHz and A-law: the embedded
    // Whisper hears words of it (the exact words are the recogniser's, not the line's).
    assert!(
        said.iter()
            .any(|t| !t.starts_with("dtmf") && t.split_whitespace().count() >= 2),
        "the question was heard: {said:?}"
    );
    assert!(
        said.iter().any(|t| t.contains("dtmf: 1#")),
        "the RTP key and the INFO key were heard, in order: {said:?}"
    );
    let answers: usize = report["turns"]
        .as_array()
        .expect("turns")
        .iter()
        .map(|t| t["llm"].as_array().map_or(0, Vec::len))
        .sum();
    // A loaded recogniser may join the key to the question's turn: one answer at least.
    assert!(answers >= 1, "the bot answered: {report}");
    let recording = wav::read(records.join(report["audio"].as_str().expect("the recording")))
        .expect("the recording reads");
    let loud_bot = loud_samples(&recording, 1);
    assert!(
        loud_bot > 4000,
        "the bot's voice went out: {loud_bot} loud samples"
    );
}

/// baresip's configuration: SIP on `sip_port`, its RTP on ports of its own, no sound card (ALSA's
/// null device), `question` read as the microphone, and each call's audio both ways dumped
/// into `work` (`dump-…-dec.wav` is what it heard, at the decoder's format).
fn baresip_folder(work: &Path, sip_port: u16, question: &Path) {
    let config = format!(
        "poll_method epoll\nsip_listen 127.0.0.1:{sip_port}\nrtp_ports 23000-23099\n\
         audio_player alsa,null\naudio_alert alsa,null\naudio_source aufile,{}\n\
         ausrc_srate 16000\nausrc_channels 1\nauplay_srate 16000\nauplay_channels 1\n\
         module_path /usr/lib/baresip/modules\nmodule g711.so\nmodule opus.so\n\
         module aufile.so\nmodule alsa.so\nmodule sndfile.so\nmodule_app account.so\n\
         module_app menu.so\nsnd_path {}\n",
        question.display(),
        work.display()
    );
    std::fs::write(work.join("config"), config).expect("config");
    // Opus first: the phone a softphone user has. No registration.
    let account = "<sip:caller@127.0.0.1>;regint=0;audio_codecs=opus/48000/2,PCMU\n";
    std::fs::write(work.join("accounts"), account).expect("accounts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_baresip_softphone_calls_in_opus_is_heard_and_hears_the_bot_answer() {
    assert!(
        Path::new("/usr/bin/baresip").exists(),
        "baresip is not installed: scripts/setup.sh --test installs baresip-core"
    );
    let (options, records, sip_port) = recording_sip("baresip-records", 22_600..=22_699);
    let work = scratch("baresip");
    let _server = start_options(options).await;

    // The question, then ten seconds of the room while the bot answers: baresip hangs up when
    // its file ends (and quits at 20 s). A quiet room's floor under it all, as a microphone
    // sends.
    let question = wav::read(HELLO).expect("the question");
    let mut said = question.to_mono();
    said.resize(said.len() + 16_000 * 10, 0);
    let room = Room {
        noise: Noise::Brown,
        dbfs: -55.0,
    };
    let said = mix(&said, &room.tone(said.len(), 3).expect("room tone"));
    let microphone = work.join("question.wav");
    wav::write(
        &microphone,
        &wav::Wav {
            samples: said,
            sample_rate: 16_000,
            channels: 1,
        },
    )
    .expect("the question written");
    baresip_folder(&work, free_udp_port(), &microphone);
    let baresip = tokio::process::Command::new("baresip")
        .arg("-f")
        .arg(&work)
        // Its own address in the SDP must be one that may call: loopback's.
        .args(["-n", "127.0.0.1", "-t", "20", "-e"])
        .arg(format!("/dial sip:agent@127.0.0.1:{sip_port}"))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let baresip = tokio::time::timeout(Duration::from_secs(90), baresip)
        .await
        .expect("baresip finished")
        .expect("baresip ran");
    let log = String::from_utf8_lossy(&baresip.stdout);
    assert!(
        log.contains("Set audio decoder: opus"),
        "the call was in Opus: {log}"
    );

    let report = report_in(&records).await;
    assert_eq!(report["transport"], "sip");
    let said = user_said(&report).join(" ");
    assert!(
        said.contains("weather") && said.contains("paris"),
        "the question was heard through Opus: {said:?}"
    );
    // What baresip heard, as its Opus decoder gave it (48 kHz, two channels).
    let heard = std::fs::read_dir(&work)
        .expect("the dumps")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-dec.wav"))
        .expect("baresip dumped what it heard");
    let heard = wav::read(&heard).expect("the dump reads");
    assert_eq!((heard.sample_rate, heard.channels), (48_000, 2));
    let loud = loud_samples(&heard, 0);
    assert!(
        loud > 48_000 / 2,
        "the bot's answer reached the softphone: {loud} loud samples"
    );
}

/// The report of the one session recorded in `records`, once it is written (as the session
/// ends).
async fn report_in(records: &Path) -> serde_json::Value {
    for _ in 0..100 {
        let report = std::fs::read_dir(records)
            .expect("records")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "json"));
        if let Some(report) = report {
            let text = std::fs::read_to_string(&report).expect("report");
            return serde_json::from_str(&text).expect("JSON");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no report in {}", records.display());
}

/// How many of a stereo recording's samples on `channel` (0 the user, 1 the bot) are loud.
fn loud_samples(recording: &wav::Wav, channel: usize) -> usize {
    recording
        .samples
        .chunks(2)
        .filter(|frame| frame.get(channel).is_some_and(|s| s.unsigned_abs() > 1000))
        .count()
}

/// What the user said in a session's `report`, lower-cased.
fn user_said(report: &serde_json::Value) -> Vec<String> {
    report["turns"]
        .as_array()
        .expect("turns")
        .iter()
        .flat_map(|t| t["user_text"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_lowercase))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_placed_to_a_sipp_callee_is_answered_and_hears_its_own_voice_echoed_back() {
    let records = scratch("placed");
    let server = start_options(bakery(&records, 22_000..=22_999)).await;
    let token = [("Authorization", "Bearer t0k3n")];

    // SIPp as the callee: it rings, answers in PCMU and sends voxide's audio back.
    let (callee_port, mut callee) = sipp_callee(&scratch("callee"), &["-sn", "uas", "-rtp_echo"]);

    // Without the token, or to an address the operator did not allow, nothing is dialled.
    let to = format!(r#"{{"to": "sip:bob@127.0.0.1:{callee_port}", "time_limit_s": 20}}"#);
    let (status, _) = common::request(server.addr, "POST", "/calls", &to).await;
    assert_eq!(status, 401);
    let elsewhere = r#"{"to": "sip:bob@192.0.2.1:5060"}"#;
    let (status, body) =
        common::request_with(server.addr, "POST", "/calls", &token, elsewhere).await;
    assert_eq!(status, 403, "{body}");
    // Nor through a Twilio account this node was not given.
    let twilio = r#"{"to": "+15551234567", "from": "+15557654321", "via": "twilio"}"#;
    let (status, body) = common::request_with(server.addr, "POST", "/calls", &token, twilio).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--twilio-account-sid"), "{body}");

    let id = place_call(server.addr, &to, (callee_port, &mut callee)).await;
    let state = |id: String| {
        let addr = server.addr;
        async move {
            let (status, body) =
                common::request_with(addr, "GET", &format!("/calls/{id}"), &token, "").await;
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).expect("JSON")
        }
    };

    // voxide hangs up at the time limit; SIPp, answered by voxide's BYE, ends its one call.
    let callee = finished(callee, 90).await;
    succeeded(&callee, "SIPp's call failed");
    let report = report_in(&records).await;
    assert_eq!(report["transport"], "sip");
    let ended = state(id.clone()).await;
    assert_eq!(ended["state"], "ended", "{ended}");
    assert_eq!(ended["reason"], "hung_up", "{ended}");
    // The greeting went out over RTP and came back from SIPp's echo: SIPp sends no audio
    // of its own, so what voxide heard of the callee is its own voice.
    let recording = wav::read(records.join(report["audio"].as_str().expect("the recording")))
        .expect("the recording reads");
    let loud = |channel| loud_samples(&recording, channel);
    assert!(loud(1) > 4000, "the bot's voice went out: {}", loud(1));
    assert!(
        loud(0) > loud(1) / 2,
        "the callee sent it back: {} of {} loud samples",
        loud(0),
        loud(1)
    );
}

/// SIPp as a callee: it answers in PCMU, says what `callee.pcap` holds (a person's "Hello?",
/// or a machine's greeting and beep), and answers voxide's BYE.
const CALLEE: &str = include_str!("../assets/test/sipp/callee.xml");

/// `text` in espeak-ng's voice (none voxide tuned on), at 8 kHz.
fn spoken_at_8k(text: &str) -> Vec<i16> {
    use voxide::services::tts::{EspeakVoice, Synthesizer};
    let speech = EspeakVoice::new("en")
        .expect("espeak-ng")
        .synthesize(text)
        .expect("speech");
    StreamResampler::new(speech.sample_rate, 8_000)
        .expect("resampler")
        .process(&speech.samples)
}

/// A voicemail greeting, a pause, a 1 kHz beep of half a second, then the quiet of a machine
/// recording, at 8 kHz; and how long the greeting and the beep are, in samples.
fn voicemail_greeting() -> (Vec<i16>, usize) {
    let mut audio = spoken_at_8k(
        "Hi, you've reached Sam. I can't take your call right now. Please leave a message after the tone.",
    );
    audio.extend(std::iter::repeat_n(0, 4_000));
    audio.extend(
        (0..4_000).map(|n| {
            (9_000.0 * (std::f32::consts::TAU * 1_000.0 * n as f32 / 8_000.0).sin()) as i16
        }),
    );
    let beep_end = audio.len();
    audio.extend(std::iter::repeat_n(0, 8_000 * 12));
    (audio, beep_end)
}

/// What a call the bakery's bot placed came to: the call's state once ended, the session's
/// report and its recording.
struct Placed {
    call: serde_json::Value,
    report: serde_json::Value,
    recording: wav::Wav,
}

impl Placed {
    /// Everything the bot said, in order.
    fn bot_said(&self) -> Vec<String> {
        self.report["turns"]
            .as_array()
            .expect("turns")
            .iter()
            .flat_map(|t| t["bot_text"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t.as_str().map(str::to_owned))
            .collect()
    }
}

/// The bakery's bot (a greeting for a person, a `[voicemail]` message for a machine) calls
/// SIPp, whose callee answers in PCMU with `audio` over a room's noise floor; the call may last
/// `time_limit_s`.
async fn bakery_calls(name: &str, audio: &[i16], time_limit_s: u64) -> Placed {
    let records = scratch(name);
    let mut options = bakery(&records, 24_000..=24_999);
    options.bots[0].voicemail = Some(voxide::bot::answered_by::Voicemail {
        message: Some("This is the bakery. Your cake is ready.".into()),
        ask_llm: false,
    });
    let server = start_options(options).await;
    let token = [("Authorization", "Bearer t0k3n")];

    // A phone in a quiet room: brown noise at -55 dBFS under the callee's words and in every gap.
    let room = Room {
        noise: Noise::Brown,
        dbfs: -55.0,
    };
    let audio = mix(audio, &room.tone(audio.len(), 7).expect("room tone"));
    let payloads: Vec<Vec<u8>> = audio
        .chunks(160)
        .map(|c| {
            let mut bytes: Vec<u8> = c.iter().map(|s| voxide::audio::mulaw::encode(*s)).collect();
            bytes.resize(160, voxide::audio::mulaw::encode(0));
            bytes
        })
        .collect();
    let work = scratch(&format!("{name}-callee"));
    std::fs::write(work.join("callee.pcap"), pcap(&payloads, 0)).expect("pcap");
    std::fs::write(work.join("callee.xml"), CALLEE).expect("scenario");
    let (callee_port, mut callee) = sipp_callee(&work, &["-sf", "callee.xml"]);
    let to =
        format!(r#"{{"to": "sip:sam@127.0.0.1:{callee_port}", "time_limit_s": {time_limit_s}}}"#);
    let id = place_call(server.addr, &to, (callee_port, &mut callee)).await;

    let callee = finished(callee, 90).await;
    succeeded(&callee, "SIPp's callee never heard voxide's BYE");
    let mut call = serde_json::Value::Null;
    for _ in 0..100 {
        let (status, body) =
            common::request_with(server.addr, "GET", &format!("/calls/{id}"), &token, "").await;
        assert_eq!(status, 200, "{body}");
        call = serde_json::from_str(&body).expect("JSON");
        if call["state"] == "ended" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = report_in(&records).await;
    let recording = wav::read(records.join(report["audio"].as_str().expect("the recording")))
        .expect("the recording reads");
    Placed {
        call,
        report,
        recording,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answering_machine_gets_the_message_after_its_beep_not_the_greeting() {
    let (greeting, beep_end) = voicemail_greeting();
    let placed = bakery_calls("machine", &greeting, 60).await;
    // voxide leaves its message and hangs up, long before the time limit.
    assert_eq!(placed.call["answered_by"], "machine", "{}", placed.call);
    assert_eq!(placed.call["reason"], "hung_up", "{}", placed.call);

    // The bot said nothing over the greeting, and its message after the beep.
    let rate = placed.recording.sample_rate as usize;
    let frames: Vec<&[i16]> = placed.recording.samples.chunks(2).collect();
    // Where the beep ends in the recording: the callee's last loud sample.
    let beep_ends_at = frames
        .iter()
        .rposition(|f| f[0].unsigned_abs() > 1000)
        .expect("the machine was heard");
    let bot_loud = |range: std::ops::Range<usize>| {
        frames[range]
            .iter()
            .filter(|f| f[1].unsigned_abs() > 1000)
            .count()
    };
    let greeting_starts_at = beep_ends_at.saturating_sub(beep_end * rate / 8_000);
    // The two channels are placed as voxide heard and spoke, a packet or two apart: the
    // message may start right at the beep's end, not before.
    let margin = rate / 10;
    assert_eq!(
        bot_loud(greeting_starts_at..beep_ends_at - margin),
        0,
        "the bot spoke over the machine's greeting"
    );
    assert!(
        bot_loud(beep_ends_at..frames.len()) > rate / 4,
        "the message went out after the beep"
    );
    let said = placed.bot_said();
    assert!(
        said.iter().any(|t| t.contains("Your cake is ready")),
        "{said:?}"
    );
    assert!(
        !said.iter().any(|t| t.contains("calling about your cake")),
        "the greeting for a person went to the machine: {said:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_who_answers_hello_is_greeted_and_never_hears_the_voicemail() {
    let mut hello = vec![0; 4_000];
    hello.extend(spoken_at_8k("Hello?"));
    hello.extend(std::iter::repeat_n(0, 8_000 * 14));
    let placed = bakery_calls("person", &hello, 10).await;
    assert_eq!(placed.call["answered_by"], "human", "{}", placed.call);
    assert_eq!(
        placed.call["answered_because"], "short_greeting",
        "{}",
        placed.call
    );
    let said = placed.bot_said();
    assert_eq!(
        said.first().map(String::as_str),
        Some("Hello, this is the bakery calling about your cake."),
        "{said:?}"
    );
    assert!(
        !said.iter().any(|t| t.contains("Your cake is ready")),
        "{said:?}"
    );
}

/// [`SCENARIO`]'s caller, asking its question, then handed over by voxide's REFER (whose
/// Refer-To it checks): it accepts, reports the new call up, and answers voxide's BYE.
fn transferred() -> String {
    let play = "<nop><action><exec play_pcap_audio=\"hello.pcap\"/></action></nop>\n";
    let asked = SCENARIO.find(play).expect("the question") + play.len();
    format!(
        "{}{}</scenario>\n",
        &SCENARIO[..asked],
        r#"  <recv request="REFER">
    <action>
      <ereg regexp="sip:2001@10\.0\.0\.5" search_in="hdr" header="Refer-To:" check_it="true" assign_to="1"/>
      <log message="referred to [$1]"/>
    </action>
  </recv>
  <send><![CDATA[
SIP/2.0 202 Accepted
[last_Via:]
[last_From:]
[last_To:]
[last_Call-ID:]
[last_CSeq:]
Content-Length: 0
]]></send>
  <send retrans="500"><![CDATA[
NOTIFY sip:voxide@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]caller[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 2 NOTIFY
Event: refer
Subscription-State: terminated;reason=noresource
Max-Forwards: 70
Content-Type: message/sipfrag
Content-Length: [len]

SIP/2.0 200 OK
]]></send>
  <recv response="200"/>
  <recv request="BYE"/>
  <send><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:]
[last_Call-ID:]
[last_CSeq:]
Content-Length: 0
]]></send>
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_hands_a_sip_caller_over_with_refer_after_saying_so() {
    use common::llm_stand_in::{self, Reply};
    // The model: any question is for sales; it says so and calls transfer_call.
    let reply = |body: &serde_json::Value| {
        let chunks = if body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| m["role"].clone())
            == Some(serde_json::json!("tool"))
        {
            vec![
                serde_json::json!({"choices": [{"delta": {"content": "Sorry, that did not work."}, "finish_reason": "stop"}]}),
            ]
        } else {
            vec![
                serde_json::json!({"choices": [{"delta": {"content": "I'll put you through to sales."}}]}),
                serde_json::json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_t", "type": "function",
                    "function": {"name": "transfer_call", "arguments": "{\"destination\": \"sales\"}"}}]}}]}),
                serde_json::json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            ]
        };
        let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        Reply::Stream(out, 64)
    };
    let (addr, _stand_in) =
        llm_stand_in::start(vec![Reply::With(std::sync::Arc::new(reply))]).await;
    let (mut options, records, sip_port) = recording_sip("transferred", 24_000..=24_999);
    options.bots[0].llm = voxide::bot::LlmChoice::Text(vec![voxide::bot::TextLlm::OpenAi(
        voxide::services::llm::openai::OpenAiSettings {
            base_url: format!("http://{addr}/v1"),
            model: "gpt-4.1-mini".into(),
            ..Default::default()
        },
    )]);
    options.bots[0].transfer = vec![("sales".into(), "sip:2001@10.0.0.5".into())];
    let _server = start_options(options).await;

    let work = caller_folder("transferred-caller", &transferred());
    let sipp = sipp_caller(&work, sip_port, &[]).await;
    succeeded(&sipp, "SIPp was not handed over");
    // The words went out before the REFER: the bot's voice is in the recording.
    let report = report_in(&records).await;
    let recording = wav::read(records.join(report["audio"].as_str().expect("the recording")))
        .expect("the recording reads");
    assert!(
        loud_samples(&recording, 1) > 4000,
        "the bot said it would transfer: {}",
        loud_samples(&recording, 1)
    );
}

/// Sends `message` to `to` from a fresh socket; the status of the answer, and the answer.
async fn ask(to: SocketAddr, message: &str) -> Option<(u16, String)> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("a socket");
    socket.send_to(message.as_bytes(), to).await.expect("sent");
    let mut buffer = vec![0u8; 65_535];
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), socket.recv_from(&mut buffer))
        .await
        .ok()?
        .expect("received");
    let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    Some((status, text))
}

/// What the other side of `stream` sends next ("" when it closes), within 5 s.
async fn read_some(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0u8; 4_096];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
        Ok(Ok(n)) => Some(String::from_utf8_lossy(&buffer[..n]).into_owned()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sip_over_tcp_answers_on_the_connection_pongs_a_ping_and_closes_on_a_broken_stream() {
    use tokio::io::AsyncWriteExt;
    let sip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let mut options = sip_options(sip, 22_800..=22_899, Network::loopback());
    if let Some(sip) = &mut options.sip {
        sip.tcp = true;
    }
    let _server = start_options(options).await;
    let mut stream = tokio::net::TcpStream::connect(sip).await.expect("connects");
    let probe = "OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK-t\r\n\
                 From: <sip:c@127.0.0.1>;tag=1\r\nTo: <sip:a@127.0.0.1>\r\nCall-ID: tcp-probe\r\n\
                 CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n";
    // A probe sent in two pieces: one answer, on this connection.
    let (head, tail) = probe.split_at(40);
    stream.write_all(head.as_bytes()).await.expect("sent");
    stream.write_all(tail.as_bytes()).await.expect("sent");
    let answer = read_some(&mut stream).await.expect("an answer");
    assert!(answer.starts_with("SIP/2.0 200 OK\r\n"), "{answer}");
    assert!(answer.contains("Via: SIP/2.0/TCP"), "{answer}");
    // A keepalive ping gets its pong.
    stream.write_all(b"\r\n\r\n").await.expect("sent");
    assert_eq!(read_some(&mut stream).await.as_deref(), Some("\r\n"));
    // A length past what a message may be: the stream cannot be read on and is closed.
    let huge = probe.replace("Content-Length: 0", "Content-Length: 900000");
    stream.write_all(huge.as_bytes()).await.expect("sent");
    assert_eq!(read_some(&mut stream).await.as_deref(), Some(""), "closed");
}

/// An INVITE with `sdp` as its offer, in call `call_id`.
fn invite(to: SocketAddr, call_id: &str, sdp: &str) -> String {
    format!(
        "INVITE sip:agent@{to} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK-{call_id}\r\n\
         From: <sip:caller@127.0.0.1>;tag=c-{call_id}\r\nTo: <sip:agent@{to}>\r\n\
         Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:caller@127.0.0.1:5999>\r\n\
         Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
        sdp.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_unwelcome_invite_is_refused_with_the_status_sip_gives_it() {
    let sip_port = free_udp_port();
    let sip = SocketAddr::from(([127, 0, 0, 1], sip_port));
    let mut options = sip_options(sip, 22_000..=22_099, Network::loopback());
    options.access.sessions_per_minute = 3;
    let _server = start_options(options).await;
    let g729 = "v=0\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 7000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n";

    // No codec in common: 488, saying what voxide speaks.
    let (status, answer) = ask(sip, &invite(sip, "g729-1", g729))
        .await
        .expect("an answer");
    assert_eq!(status, 488, "{answer}");
    assert!(answer.contains("Opus, G722, PCMU or PCMA"), "{answer}");
    // Media sent anywhere but to a network that may call: refused, so no caller points
    // voxide's audio at an address of its choosing.
    let elsewhere = "v=0\r\nc=IN IP4 10.9.9.9\r\nt=0 0\r\nm=audio 7000 RTP/AVP 0\r\n";
    let (status, answer) = ask(sip, &invite(sip, "elsewhere-1", elsewhere))
        .await
        .expect("an answer");
    assert_eq!(status, 488, "{answer}");
    assert!(answer.contains("media address"), "{answer}");
    // A broken offer: 400.
    let (status, _) = ask(
        sip,
        &invite(sip, "broken-1", "v=0\r\nm=audio x RTP/AVP 0\r\n"),
    )
    .await
    .expect("an answer");
    assert_eq!(status, 400);
    // A call nobody opened: 481. A probe: 200.
    let bye = "BYE sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK-b\r\n\
               From: <sip:c@127.0.0.1>;tag=1\r\nTo: <sip:a@127.0.0.1>;tag=2\r\nCall-ID: nobody\r\n\
               CSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(ask(sip, bye).await.map(|a| a.0), Some(481));
    let options_probe = bye.replace("BYE", "OPTIONS");
    assert_eq!(ask(sip, &options_probe).await.map(|a| a.0), Some(200));
    // Not SIP at all: no answer, and the server goes on.
    assert_eq!(ask(sip, "\u{1}\u{2} hello").await, None);
    // A flood of INVITEs: past the per-address limit, 503 with Retry-After.
    let (status, answer) = ask(sip, &invite(sip, "g729-2", g729))
        .await
        .expect("an answer");
    assert_eq!(
        status, 503,
        "the fourth call from one address in a minute: {answer}"
    );
    assert!(answer.contains("Retry-After: 60"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_outside_the_allowed_networks_is_forbidden() {
    let sip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let options = sip_options(
        sip,
        22_100..=22_199,
        vec!["192.0.2.0/24".parse().expect("a network")],
    );
    let _server = start_options(options).await;
    let pcmu = "v=0\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 7000 RTP/AVP 0\r\n";
    let (status, answer) = ask(sip, &invite(sip, "outsider", pcmu))
        .await
        .expect("an answer");
    assert_eq!(status, 403, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_from_outside_gets_in_by_digest_with_the_right_password_only() {
    use voxide::transports::sip::auth::Callers;
    use voxide::transports::sip::register::{Account, Challenge};
    let sip_port = free_udp_port();
    let sip = SocketAddr::from(([127, 0, 0, 1], sip_port));
    let mut options = sip_options(
        sip,
        22_400..=22_499,
        vec!["192.0.2.0/24".parse().expect("a network")],
    );
    if let Some(sip) = options.sip.as_mut() {
        sip.users = Some(std::sync::Arc::new(
            Callers::parse("alice:wonderland").expect("users"),
        ));
    }
    let _server = start_options(options).await;

    // Challenged, then refused with a wrong password (answered with voxide's own digest code,
    // the one it registers with).
    let pcmu = "v=0\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 7000 RTP/AVP 0\r\n";
    let (status, answer) = ask(sip, &invite(sip, "guess-1", pcmu))
        .await
        .expect("an answer");
    assert_eq!(status, 401, "{answer}");
    let challenge = answer
        .lines()
        .find_map(|l| l.strip_prefix("WWW-Authenticate: "))
        .and_then(Challenge::parse)
        .expect("a digest challenge");
    let guess = Account::parse("sip:alice@127.0.0.1", "looking-glass".into()).expect("account");
    let uri = format!("sip:agent@{sip}");
    let authorization = challenge.answer(&guess, "INVITE", &uri, 1);
    let guessed = invite(sip, "guess-2", pcmu).replacen(
        "Content-Type:",
        &format!("Authorization: {authorization}\r\nContent-Type:"),
        1,
    );
    let (status, answer) = ask(sip, &guessed).await.expect("an answer");
    assert_eq!(status, 403, "{answer}");

    // SIPp's own digest client, with the right password: challenged, answers, is taken, talks
    // and hangs up.
    let work = caller_folder("digest", &authenticating(SCENARIO));
    let sipp = sipp_caller(&work, sip_port, &["-au", "alice", "-ap", "wonderland"]).await;
    succeeded(&sipp, "SIPp's call failed");
}

/// An AudioSocket message: type, big-endian length, payload.
fn audiosocket_message(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asterisk_audiosocket_call_is_answered_at_its_own_rate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listen = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("its address")
    };
    let mut options = test_options(vec![espeak_bot()]);
    options.audiosocket = Some((listen, Network::loopback()));
    let _server = start_options(options).await;

    // A connection that names no call first is hung up.
    let mut stray = tokio::net::TcpStream::connect(listen)
        .await
        .expect("connect");
    stray
        .write_all(&audiosocket_message(0x10, &[0; 320]))
        .await
        .expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stray.read_to_end(&mut answer)).await;
    assert_eq!(answer, [0, 0, 0], "a hang-up, then the close");

    let stream = tokio::net::TcpStream::connect(listen)
        .await
        .expect("connect");
    let (mut rx, mut tx) = stream.into_split();
    tx.write_all(&audiosocket_message(0x01, &[7; 16]))
        .await
        .expect("the call's UUID");
    let reader = tokio::spawn(async move {
        let (mut loud, mut sizes) = (0usize, std::collections::BTreeSet::new());
        let mut pending: Vec<u8> = Vec::new();
        let mut buffer = vec![0u8; 8_192];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while loud <= 4000 {
            let Ok(Ok(n)) = tokio::time::timeout_at(deadline, rx.read(&mut buffer)).await else {
                break;
            };
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buffer[..n]);
            while pending.len() >= 3 {
                let length = usize::from(u16::from_be_bytes([pending[1], pending[2]]));
                if pending.len() < 3 + length {
                    break;
                }
                let message: Vec<u8> = pending.drain(..3 + length).collect();
                assert_eq!(message[0], 0x10, "audio at 8 kHz, the call's rate");
                sizes.insert(length);
                loud += message[3..]
                    .chunks_exact(2)
                    .filter(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs() > 1000)
                    .count();
            }
        }
        (loud, sizes)
    });
    let hello = wav::read(HELLO).expect("test audio").to_mono();
    let mut audio = StreamResampler::new(16_000, 8_000)
        .expect("resampler")
        .process(&hello);
    audio.extend(vec![0; 8_000 * 6]);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for chunk in audio.chunks(160) {
        tick.tick().await;
        let bytes: Vec<u8> = chunk.iter().flat_map(|s| s.to_le_bytes()).collect();
        if tx
            .write_all(&audiosocket_message(0x10, &bytes))
            .await
            .is_err()
            || reader.is_finished()
        {
            break;
        }
    }
    let (loud, sizes) = reader.await.expect("reader");
    assert!(loud > 4000, "the bot answered: {loud} loud samples");
    assert!(
        sizes.iter().all(|s| *s <= 320),
        "20 ms a message at most: {sizes:?}"
    );
    let _ = tx.write_all(&[0, 0, 0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tester_calls_over_sip_and_times_the_answer_from_the_rtp() {
    load_test_over_sip(voxide::loadtest::Protocol::Sip, 22_200..=22_299).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wideband_g722_call_is_answered_in_g722_and_timed_from_its_rtp() {
    load_test_over_sip(voxide::loadtest::Protocol::SipWideband, 22_500..=22_599).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opus_call_is_answered_in_opus_and_timed_from_its_rtp() {
    load_test_over_sip(voxide::loadtest::Protocol::SipOpus, 22_700..=22_799).await;
}

/// Two calls from the load tester in `protocol`'s codec, each question answered and timed from
/// the bot's RTP as the load tester decodes it.
async fn load_test_over_sip(
    protocol: voxide::loadtest::Protocol,
    rtp_ports: std::ops::RangeInclusive<u16>,
) {
    let sip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let options = sip_options(sip, rtp_ports, Network::loopback());
    let _server = start_options(options).await;
    let load = voxide::loadtest::LoadtestOptions {
        target: format!("sip:agent@{sip}"),
        protocol,
        audio: vec![HELLO.into()],
        sessions: 2,
        concurrency: 2,
        turns: 1,
        think: Duration::from_millis(200),
        barge_in_at: None,
        ramp: Duration::from_millis(500),
        stages: Vec::new(),
        seed: 5,
        response_timeout: Duration::from_secs(30),
        slos: Vec::new(),
        out: None,
        max_pacing_lag: Duration::from_secs(1),
        auth_token: None,
        room: None,
        network: Default::default(),
        received: Default::default(),
        red: 1,
    };
    let summary = voxide::loadtest::run(load).await.expect("runs");
    assert_eq!(summary.sessions.connected, 2, "{summary:?}");
    assert_eq!(summary.sessions.failed, 0, "{summary:?}");
    let v2v = summary.metrics["v2v"].expect("the answers were timed");
    assert_eq!(v2v.n, 2, "{summary:?}");
    assert!(
        v2v.p50 > 150.0,
        "the answer came after the question: {v2v:?}"
    );
}

/// A registrar as SIPp plays one: a 401 digest challenge, then 200 only when the answer to it
/// checks out for 1001 / `secret` (else 403, and the call fails).
const REGISTRAR: &str = r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="registrar">
  <recv request="REGISTER"/>
  <send><![CDATA[
SIP/2.0 401 Unauthorized
[last_Via:]
[last_From:]
[last_To:];tag=[pid]registrar
[last_Call-ID:]
[last_CSeq:]
WWW-Authenticate: Digest realm="voxide-test", nonce="[pid]nonce[call_number]"
Content-Length: 0
]]></send>
  <recv request="REGISTER">
    <action>
      <verifyauth assign_to="valid" username="1001" password="secret"/>
    </action>
  </recv>
  <nop hide="true" test="valid" next="good"/>
  <send><![CDATA[
SIP/2.0 403 Forbidden
[last_Via:]
[last_From:]
[last_To:];tag=[pid]registrar
[last_Call-ID:]
[last_CSeq:]
Content-Length: 0
]]></send>
  <recv request="NEVER" timeout="200"/>
  <label id="good"/>
  <send><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:];tag=[pid]registrar
[last_Call-ID:]
[last_CSeq:]
[last_Contact:];expires=300
Expires: 300
Content-Length: 0
]]></send>
</scenario>
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voxide_registers_with_a_pbx_answering_its_digest_challenge() {
    let registrar_port = free_udp_port();
    let work = scratch("registrar");
    std::fs::write(work.join("registrar.xml"), REGISTRAR).expect("scenario");
    let sipp = tokio::process::Command::new("sipp")
        .current_dir(&work)
        .args(["-sf", "registrar.xml", "-i", "127.0.0.1"])
        .args(["-p", &registrar_port.to_string(), "-m", "1"])
        .args(["-timeout", "30", "-timeout_error", "-nostdin", "-trace_err"])
        .kill_on_drop(true)
        .output();
    let sipp = tokio::spawn(sipp);
    let mut options = test_options(vec![espeak_bot()]);
    options.sip = Some(SipOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], free_udp_port())),
        tcp: false,
        public_ip: None,
        rtp_ports: 22_300..=22_399,
        allow: Network::loopback(),
        register: Some(
            voxide::transports::sip::register::Account::parse(
                &format!("sip:1001@127.0.0.1:{registrar_port}"),
                "secret".into(),
            )
            .expect("an account"),
        ),
        users: None,
    });
    let server = start_options(options).await;
    let sipp = finished(sipp, 60).await;
    succeeded(&sipp, "the registrar did not take the registration");
    // The registrar's 200 may still be on its way when SIPp exits.
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = common::get(server.addr, "/metrics").await.1;
        if metrics.contains("\nvoxide_sip_registered 1\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        metrics.contains("\nvoxide_sip_registered 1\n"),
        "the node says it is registered: {metrics}"
    );
}

/// One call from a raw SIP socket offering PCMU at `rtp` (its address in the offer): the
/// question spoken into the call from `speaker`, then a BYE. The caller's side of the call's
/// recording comes back.
async fn call_speaking_from(
    sip: SocketAddr,
    rtp: SocketAddr,
    speaker: &tokio::net::UdpSocket,
    records: &Path,
) -> Vec<i16> {
    use voxide::transports::sip::message::SipMessage;
    use voxide::transports::sip::rtp::Sender;
    use voxide::transports::sip::sdp::Offer;
    let signalling = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("a socket");
    let call_id = format!("spoof-{}", rtp.port());
    let sdp = format!(
        "v=0\r\nc=IN IP4 {}\r\nt=0 0\r\nm=audio {} RTP/AVP 0\r\n",
        rtp.ip(),
        rtp.port()
    );
    signalling
        .send_to(invite(sip, &call_id, &sdp).as_bytes(), sip)
        .await
        .expect("INVITE");
    let mut buffer = vec![0u8; 65_535];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), signalling.recv_from(&mut buffer))
        .await
        .expect("an answer")
        .expect("received");
    let ok = SipMessage::parse(&buffer[..n]).expect("SIP");
    let answer = Offer::parse(std::str::from_utf8(&ok.body).expect("SDP")).expect("an answer");
    let to_tag = ok.param("To", "tag").expect("a tag").to_owned();
    let in_dialog = |method: &str, cseq: u32| {
        format!(
            "{method} sip:agent@{sip} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK-{call_id}-{cseq}\r\n\
             From: <sip:caller@127.0.0.1>;tag=c-{call_id}\r\nTo: <sip:agent@{sip}>;tag={to_tag}\r\n\
             Call-ID: {call_id}\r\nCSeq: {cseq} {method}\r\nContent-Length: 0\r\n\r\n"
        )
    };
    signalling
        .send_to(in_dialog("ACK", 1).as_bytes(), sip)
        .await
        .expect("ACK");
    let narrow = question_at_8k();
    let mut sender = Sender::new(0, 7, 7);
    let to = SocketAddr::new(answer.address, answer.port);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for chunk in narrow.chunks(160) {
        tick.tick().await;
        let payload: Vec<u8> = chunk
            .iter()
            .map(|s| voxide::audio::mulaw::encode(*s))
            .collect();
        speaker
            .send_to(&sender.packet(&payload, 160), to)
            .await
            .expect("RTP");
    }
    signalling
        .send_to(in_dialog("BYE", 2).as_bytes(), sip)
        .await
        .expect("BYE");
    let id_part = "sip-";
    for _ in 0..100 {
        let recording = std::fs::read_dir(records)
            .expect("records")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.extension().is_some_and(|x| x == "json")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(id_part))
            });
        if let Some(report) = recording {
            let report: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&report).expect("report"))
                    .expect("JSON");
            let wav = wav::read(records.join(report["audio"].as_str().expect("audio")))
                .expect("the recording");
            let _ = std::fs::remove_dir_all(records);
            std::fs::create_dir_all(records).expect("records again");
            return wav.samples.chunks(2).map(|frame| frame[0]).collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no recording of the call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtp_from_another_address_than_the_offer_is_not_heard() {
    let sip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let records = scratch("spoof-records");
    let mut options = sip_options(sip, 22_400..=22_499, Network::loopback());
    options.record_dir = Some(records.clone());
    let _server = start_options(options).await;
    let loud = |caller: &[i16]| caller.iter().filter(|s| s.unsigned_abs() > 1000).count();

    // The caller's own address: heard.
    let speaker = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("a socket");
    let own = speaker.local_addr().expect("address");
    let heard = call_speaking_from(sip, own, &speaker, &records).await;
    assert!(
        loud(&heard) > 4000,
        "the caller was heard: {}",
        loud(&heard)
    );

    // The same audio from 127.0.0.2, while the offer named 127.0.0.1: dropped.
    let intruder = tokio::net::UdpSocket::bind("127.0.0.2:0")
        .await
        .expect("a second loopback address");
    let heard = call_speaking_from(sip, own, &intruder, &records).await;
    assert_eq!(loud(&heard), 0, "RTP from another address was heard");
}
